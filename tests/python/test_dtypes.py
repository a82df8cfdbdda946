import pytest
import torch

DEVICE = "max_device"

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64,
          torch.bool]


def sample(dtype):
    if dtype == torch.bool:
        return torch.tensor([[True, False, True], [False, False, True]])
    return torch.tensor([[1, -2, 3], [4, 5, -6]]).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_and_factories(dtype):
    x = sample(dtype)
    d = x.to(DEVICE)
    assert d.dtype == dtype and d.device.type == DEVICE
    assert d.element_size() == x.element_size()
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    z = torch.zeros(2, 3, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(z.cpu(), torch.zeros(2, 3, dtype=dtype), rtol=0, atol=0)
    o = torch.ones(2, 3, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(o.cpu(), torch.ones(2, 3, dtype=dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ops_match_cpu(dtype):
    x = sample(dtype)
    d = x.to(DEVICE)
    cases = [
        lambda t: t.sum(),
        lambda t: t == t.flip(0),
        lambda t: t.t().contiguous(),
        lambda t: torch.where(t != 0, t, t.flip(1)),
        lambda t: t[:, 1:],
        lambda t: torch.cat([t, t], 0),
        lambda t: t.max(),
    ]
    if dtype != torch.bool:
        cases += [lambda t: t + t, lambda t: t * 3, lambda t: t.abs(), lambda t: t.neg().cumsum(1)]
    if dtype.is_floating_point:
        cases += [lambda t: t.exp(), lambda t: t / 7, lambda t: t.mean(1), lambda t: t @ t.t(),
                  lambda t: torch.softmax(t, 1)]
    for fn in cases:
        got, want = fn(d), fn(x)
        assert got.device.type == DEVICE
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_item_and_conversion(dtype):
    d = sample(dtype).to(DEVICE)
    assert d[0, 0].item() == sample(dtype)[0, 0].item()
    f = d.to(torch.float32)
    torch.testing.assert_close(f.cpu(), sample(dtype).to(torch.float32))
