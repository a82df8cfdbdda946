import torch

DEVICE = "max_device"


def storage_ptr(t):
    return t.untyped_storage().data_ptr()


def assert_view_of(view, base):
    assert view.device.type == DEVICE
    assert view._is_view()
    assert storage_ptr(view) == storage_ptr(base)


def base_tensor():
    return torch.arange(24.0, device=DEVICE).reshape(4, 6)


def test_slice_is_view_and_writes_through():
    b = base_tensor()
    v = b[1:3, 2:5]
    assert_view_of(v, b)
    assert v.storage_offset() == 8
    v.fill_(-1)
    expected = torch.arange(24.0).reshape(4, 6)
    expected[1:3, 2:5] = -1
    torch.testing.assert_close(b.cpu(), expected)


def test_transpose_view():
    b = base_tensor()
    v = b.t()
    assert_view_of(v, b)
    assert v.stride() == (1, 6)
    v[0, 1] = 100
    assert b[1, 0].item() == 100
    v2 = b.transpose(0, 1)
    expected = torch.arange(24.0).reshape(4, 6)
    expected[1, 0] = 100
    torch.testing.assert_close(v2.cpu(), expected.t())


def test_view_and_reshape():
    b = base_tensor()
    v = b.view(2, 12)
    assert_view_of(v, b)
    v[1, 0] = 55
    assert b[2, 0].item() == 55
    r = b.reshape(3, 8)
    assert storage_ptr(r) == storage_ptr(b)
    flat = b.view(-1)
    assert flat.shape == (24,)
    # reshape of a non-contiguous tensor copies (a new storage)
    rc = b.t().reshape(-1)
    assert storage_ptr(rc) != storage_ptr(b)
    torch.testing.assert_close(rc.cpu(), b.cpu().t().reshape(-1))


def test_expand_view():
    b = torch.tensor([1.0, 2.0, 3.0], device=DEVICE)
    e = b.expand(4, 3)
    assert_view_of(e, b)
    assert e.stride() == (0, 1)
    torch.testing.assert_close(e.cpu(), torch.tensor([1.0, 2.0, 3.0]).expand(4, 3))
    b[0] = 9
    assert e[3, 0].item() == 9


def test_as_strided():
    b = base_tensor()
    v = torch.as_strided(b, (3, 3), (7, 1), 1)
    assert_view_of(v, b)
    expected = torch.as_strided(torch.arange(24.0), (3, 3), (7, 1), 1)
    torch.testing.assert_close(v.cpu(), expected)
    v[2, 2] = -5
    assert b.view(-1)[1 + 14 + 2].item() == -5


def test_unsqueeze_squeeze_permute_select_narrow_unfold():
    b = base_tensor()
    cpu = torch.arange(24.0).reshape(4, 6)
    for fn in (lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(-1).squeeze(-1),
               lambda t: t.reshape(2, 2, 6).permute(2, 0, 1), lambda t: t.select(1, 3),
               lambda t: t.narrow(1, 1, 3), lambda t: t.unfold(1, 2, 2), lambda t: t[..., None, ::2],
               lambda t: t.movedim(0, 1), lambda t: t.diagonal(), lambda t: t.unbind(0)[2],
               lambda t: t.chunk(3, dim=1)[1], lambda t: t.split(2)[1], lambda t: t.real):
        v = fn(b)
        assert_view_of(v, b)
        torch.testing.assert_close(v.cpu(), fn(cpu))


def test_view_of_view_writes_reach_base():
    b = base_tensor()
    v = b[1:].t()[2:4]
    v.mul_(0)
    expected = torch.arange(24.0).reshape(4, 6)
    expected[1:].t()[2:4].mul_(0)
    torch.testing.assert_close(b.cpu(), expected)


def test_in_place_fallback_op_on_view():
    b = base_tensor()
    b[:, 1].add_(1000)  # add_ on a strided view goes through the fallback
    expected = torch.arange(24.0).reshape(4, 6)
    expected[:, 1] += 1000
    torch.testing.assert_close(b.cpu(), expected)


def test_view_dtype():
    b = torch.zeros(4, device=DEVICE)
    v = b.view(torch.int32)
    # like on the CPU, a dtype view is not an autograd view, but it shares the bytes
    assert v.device.type == DEVICE
    assert storage_ptr(v) == storage_ptr(b)
    v[0] = 1065353216  # bits of 1.0f
    assert b[0].item() == 1.0


def test_detach_shares_storage():
    b = base_tensor()
    d = b.detach()
    assert storage_ptr(d) == storage_ptr(b)
    d[0, 0] = 42
    assert b[0, 0].item() == 42


def test_contiguous_copies_non_contiguous():
    b = base_tensor()
    t = b.t()
    c = t.contiguous()
    assert c.is_contiguous() and storage_ptr(c) != storage_ptr(b)
    assert b.contiguous() is b
