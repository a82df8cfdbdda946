import torch

DEVICE = "max_device"


def leaf_pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x.clone().requires_grad_(), x.to(DEVICE).requires_grad_()


def test_simple_backward():
    x, d = leaf_pair(3, 4)
    (x * x).sum().backward()
    (d * d).sum().backward()
    assert d.grad.device.type == DEVICE
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_backward_through_views_and_matmul():
    x, d = leaf_pair(4, 5)
    w, dw = leaf_pair(5, 3, seed=1)

    def f(a, b):
        return (a[1:].t()[:, :2].sum() + (a @ b).relu().pow(2).mean() + a.expand(2, 4, 5).sum())

    f(x, w).backward()
    f(d, dw).backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)
    torch.testing.assert_close(dw.grad.cpu(), w.grad)


def test_grad_accumulates():
    x, d = leaf_pair(3)
    for _ in range(3):
        (d * 2).sum().backward()
        (x * 2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)
    assert d.grad.tolist() == [6.0, 6.0, 6.0]


def test_autograd_grad_and_non_scalar_backward():
    x, d = leaf_pair(3)
    (gx,) = torch.autograd.grad(x.exp().sum(), x)
    (gd,) = torch.autograd.grad(d.exp().sum(), d)
    torch.testing.assert_close(gd.cpu(), gx)
    y = d * 3
    y.backward(torch.ones(3, device=DEVICE))
    assert d.grad.tolist() == [3.0, 3.0, 3.0]


def test_backward_of_fallback_and_in_place_ops():
    x, d = leaf_pair(6)
    idx = torch.tensor([0, 2, 2, 5])

    def f(a, i):
        b = a.clone()
        b.mul_(2)
        return b.index_select(0, i).sum() + torch.gather(b, 0, i).pow(2).sum() + b.cumsum(0).sum()

    f(x, idx).backward()
    f(d, idx.to(DEVICE)).backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_grad_flows_through_transfer():
    x = torch.randn(3, requires_grad=True)
    d = x.to(DEVICE)
    assert d.grad_fn is not None
    (d * 2).sum().backward()
    assert x.grad.device.type == "cpu"
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_no_grad_and_detach():
    _, d = leaf_pair(3)
    with torch.no_grad():
        y = d * 2
    assert not y.requires_grad
    assert not d.detach().requires_grad


def test_gradcheck_double():
    d = torch.randn(3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: (t.sin() * t).sum(1), (d,))
