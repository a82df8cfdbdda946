import torch

DEVICE = "max_device"


def test_to_and_back_preserves_values():
    x = torch.randn(4, 5)
    d = x.to(DEVICE)
    assert d.device == torch.device("max_device:0")
    back = d.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x, rtol=0, atol=0)


def test_to_is_a_copy_not_an_alias():
    x = torch.zeros(3)
    d = x.to(DEVICE)
    d.add_(1)
    assert x.tolist() == [0, 0, 0]
    back = d.cpu()
    back.add_(1)
    assert d.tolist() == [1, 1, 1]


def test_to_same_device_is_identity_and_copy_true_copies():
    d = torch.ones(3, device=DEVICE)
    assert d.to(DEVICE) is d
    c = d.to(DEVICE, copy=True)
    assert c.data_ptr() != d.data_ptr()
    torch.testing.assert_close(c.cpu(), d.cpu())


def test_to_with_dtype_change():
    x = torch.arange(6, dtype=torch.int64)
    d = x.to(DEVICE, torch.float64)
    assert d.dtype == torch.float64 and d.device.type == DEVICE
    torch.testing.assert_close(d.cpu(), x.double())
    assert d.to(torch.int32).dtype == torch.int32


def test_non_contiguous_transfer():
    x = torch.randn(4, 6)[:, ::2].t()
    assert not x.is_contiguous()
    d = x.to(DEVICE)
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    y = torch.randn(6, 4, device=DEVICE).t()[1:, ::2]
    torch.testing.assert_close(y.cpu(), y.cpu().contiguous())


def test_copy_between_devices():
    src = torch.randn(3, 3)
    dst = torch.empty(3, 3, device=DEVICE)
    dst.copy_(src)
    torch.testing.assert_close(dst.cpu(), src)
    cpu_dst = torch.empty(3, 3)
    cpu_dst.copy_(dst)
    torch.testing.assert_close(cpu_dst, src)
    dst2 = torch.empty(3, 3, device=DEVICE)
    dst2.copy_(dst.t())
    torch.testing.assert_close(dst2.cpu(), src.t())


def test_copy_with_dtype_conversion_and_broadcast():
    dst = torch.empty(2, 3, dtype=torch.float64, device=DEVICE)
    dst.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))
    assert dst.tolist() == [[1.0, 2.0, 3.0]] * 2


def test_item_and_tolist():
    d = torch.tensor([1.5, 2.5], device=DEVICE)
    assert d[1].item() == 2.5
    assert d.tolist() == [1.5, 2.5]
    assert float(d[0]) == 1.5
    assert bool(torch.tensor(True, device=DEVICE))


def test_numpy_requires_cpu():
    d = torch.ones(2, device=DEVICE)
    assert d.cpu().numpy().tolist() == [1.0, 1.0]


def test_printing():
    d = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=DEVICE)
    text = repr(d)
    assert "device='max_device:0'" in text
    assert "1." in text and "4." in text
    assert "max_device" in str(torch.zeros(0, device=DEVICE))
    big = torch.arange(5000.0, device=DEVICE)
    assert "..." in repr(big)
    assert "dtype=torch.int32" in repr(torch.ones(2, dtype=torch.int32, device=DEVICE))


def test_module_to_keeps_parameters_and_ties():
    """nn.Module.to() converts parameters in place (param.data = ...), so
    Parameter objects, optimizer references and weights tied between
    modules survive; PyTorch allows that only for compatible tensor types."""
    embedding = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embedding.weight
    model = torch.nn.Sequential(embedding, head)
    weight = embedding.weight
    model.to(DEVICE)
    assert model[0].weight is weight and model[1].weight is weight
    assert weight.device.type == DEVICE
    model.to("cpu")
    assert model[1].weight is weight and weight.device.type == "cpu"


def test_copies_resolve_conjugate_and_negative_views():
    """Conjugate and negative views copy as their values (PyTorch's math-bit
    fallbacks would otherwise recurse through _copy_from until the stack
    overflows)."""
    z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    zd = z.to(DEVICE).conj()
    assert zd.is_conj()
    for copy in (zd.clone(), zd.resolve_conj(), zd.contiguous()):
        assert torch.equal(copy.cpu(), z.conj().resolve_conj())
    assert torch.equal(zd.cpu(), z.conj())
    into = torch.empty(2, dtype=torch.complex64, device=DEVICE)
    into.conj().copy_(z.to(DEVICE))  # writing through a conjugate view
    assert torch.equal(into.cpu(), z.conj())
    x = torch.tensor([1.0, -2.0])
    xd = x.to(DEVICE)._neg_view()
    assert xd.is_neg() and torch.equal(xd.clone().cpu(), -x)
