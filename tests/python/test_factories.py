import pytest
import torch

DEVICE = "max_device"


@pytest.mark.parametrize("factory, args", [
    (torch.empty, ((2, 3),)),
    (torch.zeros, ((2, 3),)),
    (torch.ones, ((2, 3),)),
    (torch.full, ((2, 3), 7.5)),
])
def test_shape_factories(factory, args):
    t = factory(*args, device=DEVICE)
    assert t.device.type == DEVICE
    assert t.shape == (2, 3)
    assert t.dtype == torch.float32
    if factory is not torch.empty:
        torch.testing.assert_close(t.cpu(), factory(*args))


def test_arange_linspace_eye():
    torch.testing.assert_close(torch.arange(10, device=DEVICE).cpu(), torch.arange(10))
    torch.testing.assert_close(torch.arange(0, 1, 0.25, device=DEVICE).cpu(), torch.arange(0, 1, 0.25))
    torch.testing.assert_close(torch.linspace(0, 1, 7, device=DEVICE).cpu(), torch.linspace(0, 1, 7))
    torch.testing.assert_close(torch.eye(4, device=DEVICE).cpu(), torch.eye(4))


def test_tensor_constructor():
    t = torch.tensor([[1, 2], [3, 4]], device=DEVICE)
    assert t.device.type == DEVICE and t.dtype == torch.int64
    assert t.tolist() == [[1, 2], [3, 4]]


def test_like_factories():
    base = torch.empty(3, 5, device=DEVICE)
    for fn in (torch.empty_like, torch.zeros_like, torch.ones_like, torch.rand_like, torch.randn_like):
        t = fn(base)
        assert t.device.type == DEVICE and t.shape == base.shape
    assert torch.zeros_like(base).sum().item() == 0
    assert torch.ones_like(base).sum().item() == 15


def test_empty_strided():
    t = torch.empty_strided((2, 3), (1, 2), device=DEVICE)
    assert t.stride() == (1, 2)
    assert t.device.type == DEVICE


def test_empty_memory_format_channels_last():
    t = torch.empty(2, 3, 4, 5, device=DEVICE, memory_format=torch.channels_last)
    assert t.is_contiguous(memory_format=torch.channels_last)


def test_zero_size_and_scalar():
    t = torch.empty(0, device=DEVICE)
    assert t.numel() == 0 and t.device.type == DEVICE
    s = torch.tensor(3.5, device=DEVICE)
    assert s.dim() == 0 and s.item() == 3.5


def test_new_factories():
    base = torch.ones(2, device=DEVICE)
    n = base.new_zeros(4)
    assert n.device.type == DEVICE and n.tolist() == [0, 0, 0, 0]
    assert base.new_full((2,), 3.0).tolist() == [3.0, 3.0]
    assert base.new_empty(3).device.type == DEVICE


def test_random_factories_shape_and_range():
    u = torch.rand(1000, device=DEVICE)
    assert u.device.type == DEVICE and 0 <= u.min().item() and u.max().item() < 1
    r = torch.randint(0, 5, (1000,), device=DEVICE)
    assert r.dtype == torch.int64 and r.min().item() >= 0 and r.max().item() < 5
    p = torch.randperm(10, device=DEVICE)
    assert sorted(p.tolist()) == list(range(10))
