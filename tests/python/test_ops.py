import pytest
import torch

import max_device

DEVICE = "max_device"

def pair(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    return x, x.to(DEVICE)


def check(got, want, **kw):
    assert got.device.type == DEVICE
    torch.testing.assert_close(got.cpu(), want, **kw)


@pytest.mark.parametrize("name, fn", [
    ("sum", lambda t: t.sum()),
    ("sum_dim", lambda t: t.sum(1)),
    ("sum_keepdim", lambda t: t.sum((0, 2), keepdim=True)),
    ("mean", lambda t: t.mean(-1)),
    ("prod", lambda t: t.prod(0)),
    ("amax", lambda t: t.amax(1)),
    ("std", lambda t: t.std(0)),
    ("var_mean", lambda t: torch.var_mean(t, 2)[0]),
    ("norm", lambda t: t.norm()),
    ("logsumexp", lambda t: t.logsumexp(1)),
    ("cumsum", lambda t: t.cumsum(2)),
    ("argmax", lambda t: t.argmax(1)),
    ("max_dim_values", lambda t: t.max(1).values),
    ("max_dim_indices", lambda t: t.max(1).indices),
    ("any", lambda t: (t > 1).any(0)),
    ("all", lambda t: (t > -5).all()),
    ("sum_noncontig", lambda t: t.transpose(0, 2)[::2].sum(1)),
])
def test_reductions(name, fn):
    x, d = pair(4, 5, 6)
    check(fn(d), fn(x))


def test_matmul_family():
    a, da = pair(5, 7, seed=1)
    b, db = pair(7, 3, seed=2)
    check(da @ db, a @ b)
    check(torch.mm(da, db), torch.mm(a, b))
    check(da.t().t() @ db, a @ b)
    v, dv = pair(7, seed=3)
    check(torch.mv(da, dv), torch.mv(a, v))
    ba, dba = pair(2, 5, 7, seed=4)
    bb, dbb = pair(2, 7, 3, seed=5)
    check(torch.bmm(dba, dbb), torch.bmm(ba, bb))
    check(torch.matmul(dba, db), torch.matmul(ba, b))
    c, dc = pair(5, 3, seed=6)
    check(torch.addmm(dc, da, db, beta=0.5, alpha=2), torch.addmm(c, a, b, beta=0.5, alpha=2))
    check(torch.nn.functional.linear(da, db.t()), torch.nn.functional.linear(a, b.t()))
    check(torch.einsum("ij,jk->ik", da, db), torch.einsum("ij,jk->ik", a, b))


def test_in_place_ops():
    x, d = pair(4, 4)
    for name, fn in [("add_", lambda t: t.add_(1.5)), ("mul_", lambda t: t.mul_(2)),
                     ("clamp_", lambda t: t.clamp_(-1, 1)), ("exp_", lambda t: t.exp_()),
                     ("sub_tensor", lambda t: t.sub_(t * 0.5)), ("relu_", lambda t: t.relu_()),
                     ("zero_", lambda t: t[1].zero_()), ("fill_", lambda t: t[:, 2].fill_(3)),
                     ("copy_", lambda t: t[0].copy_(t[3]))]:
        ptr = d.data_ptr()
        out = fn(d)
        fn(x)
        assert d.data_ptr() == ptr, name
        assert out.device.type == DEVICE
        check(d, x)
    # the return value of an in-place op on the whole tensor is the tensor itself
    assert d.add_(1) is d


def test_in_place_on_non_contiguous():
    x, d = pair(4, 6)
    d.t().mul_(2)
    x.t().mul_(2)
    check(d, x)
    d[:, ::2] += 1
    x[:, ::2] += 1
    check(d, x)


def test_out_variant_right_size():
    a, da = pair(3, 4, seed=1)
    b, db = pair(3, 4, seed=2)
    out = torch.empty(3, 4, device=DEVICE)
    ptr = out.data_ptr()
    r = torch.add(da, db, out=out)
    assert r is out and out.data_ptr() == ptr
    check(out, a + b)


def test_out_variant_resizes_empty_out():
    a, da = pair(3, 4, seed=1)
    b, db = pair(3, 4, seed=2)
    out = torch.empty(0, device=DEVICE)
    r = torch.add(da, db, out=out)
    assert r is out
    assert out.shape == (3, 4) and out.device.type == DEVICE
    check(out, a + b)
    # the resized storage belongs to the device and holds the values
    assert out.untyped_storage().nbytes() >= 12 * 4
    assert out.untyped_storage().device.type == DEVICE


def test_out_variant_resize_without_views():
    x, dx = pair(5, 3)
    out = torch.empty(0, device=DEVICE)
    torch.neg(dx, out=out)
    check(out, -x)
    out = torch.empty(0, device=DEVICE)
    torch.mm(dx.t(), dx, out=out)
    check(out, x.t() @ x)
    out2 = torch.empty(7, 7, device=DEVICE)  # wrong shape with elements: resized, with a warning
    with pytest.warns(UserWarning, match="resized"):
        torch.mm(dx.t(), dx, out=out2)
    check(out2, x.t() @ x)


def test_out_variant_resize_index_select():
    x, dx = pair(5, 3)
    idx = torch.tensor([4, 0, 2])
    out = torch.empty(0, device=DEVICE)
    torch.index_select(dx, 0, idx.to(DEVICE), out=out)
    check(out, torch.index_select(x, 0, idx))


def test_out_variant_resize_sum_dim():
    x, dx = pair(4, 5)
    out = torch.empty(0, device=DEVICE)
    torch.sum(dx, 1, out=out)
    check(out, x.sum(1))


def test_out_variant_resize_of_an_empty_view():
    a, da = pair(6)
    base = torch.zeros(2, device=DEVICE)
    out = base[:0]
    torch.neg(da, out=out)
    check(out, -a)
    assert out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_basic_indexing_and_setitem():
    x, d = pair(5, 6)
    check(d[2], x[2])
    check(d[-1, 1:4], x[-1, 1:4])
    check(d[..., 0], x[..., 0])
    d[1, 2] = 7.0
    x[1, 2] = 7.0
    d[3] = torch.arange(6.0, device=DEVICE)
    x[3] = torch.arange(6.0)
    check(d, x)


def test_advanced_indexing():
    x, d = pair(5, 6)
    idx = torch.tensor([4, 0, 0, 2])
    check(d[idx.to(DEVICE)], x[idx])
    check(d[idx.to(DEVICE), 1:3], x[idx, 1:3])
    check(d[:, [5, 1]], x[:, [5, 1]])
    rows, cols = torch.tensor([0, 1, 4]), torch.tensor([5, 2, 0])
    check(d[rows.to(DEVICE), cols.to(DEVICE)], x[rows, cols])
    mask = x > 0
    check(d[mask.to(DEVICE)], x[mask])
    check(d.masked_fill(mask.to(DEVICE), 0), x.masked_fill(mask, 0))
    # a CPU index into a device tensor also works
    check(d[idx], x[idx])


def test_index_put_and_setitem_advanced():
    x, d = pair(5, 6)
    rows, cols = torch.tensor([0, 1, 4]), torch.tensor([5, 2, 0])
    vals = torch.tensor([10.0, 20.0, 30.0])
    d.index_put_((rows.to(DEVICE), cols.to(DEVICE)), vals.to(DEVICE))
    x.index_put_((rows, cols), vals)
    check(d, x)
    d.index_put_((rows.to(DEVICE),), torch.tensor(1.0, device=DEVICE), accumulate=True)
    x.index_put_((rows,), torch.tensor(1.0), accumulate=True)
    check(d, x)
    d[d < 0] = 0
    x[x < 0] = 0
    check(d, x)
    d[torch.tensor([1, 3], device=DEVICE)] = -1.0
    x[torch.tensor([1, 3])] = -1.0
    check(d, x)


def test_gather_scatter_index_select_index_add():
    x, d = pair(4, 5)
    idx = torch.tensor([[0, 1], [4, 3], [2, 2], [0, 0]])
    check(d.gather(1, idx.to(DEVICE)), x.gather(1, idx))
    z = torch.zeros(4, 5)
    dz = z.to(DEVICE)
    dz.scatter_(1, idx.to(DEVICE), 1.0)
    z.scatter_(1, idx, 1.0)
    check(dz, z)
    i = torch.tensor([3, 1])
    check(d.index_select(0, i.to(DEVICE)), x.index_select(0, i))
    src, dsrc = pair(2, 5, seed=9)
    check(d.index_add(0, i.to(DEVICE), dsrc), x.index_add(0, i, src))


def test_elementwise_and_broadcast_and_scalars():
    a, da = pair(3, 1, 4, seed=1)
    b, db = pair(5, 1, seed=2)
    check(da + db, a + b)
    check(da * 2 - db / 3, a * 2 - b / 3)
    check(torch.where(da > 0, da, db), torch.where(a > 0, a, b))
    check(torch.maximum(da, db), torch.maximum(a, b))
    check(da.pow(2).sqrt(), a.pow(2).sqrt())
    check(da + torch.tensor(2.0, device=DEVICE), a + 2.0)
    # a CPU 0-dim tensor mixes with a device tensor, as for CUDA
    check(da + torch.tensor(2.0), a + 2.0)


def test_shape_ops_that_copy():
    a, da = pair(2, 3, seed=1)
    b, db = pair(2, 3, seed=2)
    check(torch.cat([da, db], 1), torch.cat([a, b], 1))
    check(torch.stack([da, db]), torch.stack([a, b]))
    check(da.flip(0), a.flip(0))
    check(da.roll(1, 1), a.roll(1, 1))
    check(da.repeat(2, 2), a.repeat(2, 2))
    check(torch.sort(da, 1).values, torch.sort(a, 1).values)
    check(torch.topk(da.flatten(), 3).indices, torch.topk(a.flatten(), 3).indices)
    check(torch.tril(da), torch.tril(a))
    check(torch.nonzero(da > 0), torch.nonzero(a > 0))
    check(torch.unique(torch.tensor([3, 1, 3, 2], device=DEVICE)), torch.tensor([1, 2, 3]))


def test_nn_functional():
    x, d = pair(2, 3, 8, 8)
    w, dw = pair(4, 3, 3, 3, seed=1)
    F = torch.nn.functional
    check(F.max_pool2d(d, 2), F.max_pool2d(x, 2))
    check(F.avg_pool2d(d, 2), F.avg_pool2d(x, 2))
    check(F.batch_norm(d, None, None, training=True), F.batch_norm(x, None, None, training=True))
    check(F.layer_norm(d, (8,)), F.layer_norm(x, (8,)))
    check(F.gelu(d), F.gelu(x))
    check(F.log_softmax(d, 1), F.log_softmax(x, 1))
    logits, dlogits = pair(4, 5, seed=2)
    target = torch.tensor([0, 4, 2, 1])
    check(F.cross_entropy(dlogits, target.to(DEVICE)), F.cross_entropy(logits, target))


def test_results_are_device_tensors_and_fallback_counted():
    x, d = pair(8)
    max_device.reset_fallback_counts()
    r = torch.index_select(d, 0, torch.tensor([1, 2], device=DEVICE))
    assert r.device.type == DEVICE
    assert r.untyped_storage().device.type == DEVICE
    assert max_device.fallback_counts().get("aten::index_select", 0) == 1


def test_conv2d():
    x, d = pair(2, 3, 8, 8)
    w, dw = pair(4, 3, 3, 3, seed=1)
    F = torch.nn.functional
    check(F.conv2d(d, dw, padding=1), F.conv2d(x, w, padding=1))
