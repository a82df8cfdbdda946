"""max_device.override: Python functions on top of an op's provider stack."""

import warnings

import pytest
import torch

import max_device

DEVICE = "max_device"


def relu_on_device():
    return torch.relu(torch.tensor([-1.0, 2.0], device=DEVICE)).tolist()


def test_context_manager_nesting_and_exact_restore():
    with max_device.override("aten::relu", lambda x: torch.full_like(x, 1.0)):
        assert relu_on_device() == [1.0, 1.0]
        with max_device.override("aten::relu", lambda x: torch.full_like(x, 2.0)):
            assert relu_on_device() == [2.0, 2.0]
        assert relu_on_device() == [1.0, 1.0]
    assert relu_on_device() == [0.0, 2.0]


def test_leaving_under_an_exception_restores_the_stack():
    with pytest.raises(KeyError):
        with max_device.override("aten::relu", lambda x: torch.full_like(x, 5.0)):
            assert relu_on_device() == [5.0, 5.0]
            raise KeyError("boom")
    assert relu_on_device() == [0.0, 2.0]
    assert not any(l["kind"] == "override" for e in max_device.list_ops() for l in e["layers"])


def test_not_implemented_declines_to_the_layer_below(load_plugin, fixture_file):
    load_plugin(fixture_file("good"))
    with max_device.override("aten::neg.out", lambda self, *, out: NotImplemented):
        assert torch.neg(torch.ones(2, device=DEVICE)).tolist() == [-1.0, -1.0]
        layers = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")["layers"]
        assert [l["kind"] for l in layers] == ["plugin", "override"]
        assert layers[1]["declines"] == 1 and layers[0]["calls"] == 1


def test_decorator_and_calling_the_op_inside_reaches_the_layer_below():
    @max_device.override("aten::relu")
    def doubled_relu(x):
        return torch.relu(x) * 2  # the inner relu skips this override

    try:
        assert relu_on_device() == [0.0, 4.0]
    finally:
        assert max_device.restore("aten::relu") == 1
    assert relu_on_device() == [0.0, 2.0]


def test_an_exception_in_the_override_reaches_the_caller_with_its_type():
    def broken(x):
        raise ValueError("override says no")

    with max_device.override("aten::relu", broken):
        with pytest.raises(ValueError, match="override says no"):
            relu_on_device()


def test_no_override_warning_from_pytorch_however_often():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            with max_device.override("aten::relu", lambda x: x):
                relu_on_device()


def test_ops_that_cannot_be_overridden_are_refused():
    with pytest.raises(max_device.SchemaError, match="aten::empty.memory_format"):
        max_device.override("aten::empty.memory_format", lambda *a, **k: None)
    with pytest.raises(max_device.SchemaError, match="aten::no_such_op"):
        max_device.override("aten::no_such_op", lambda x: x)


@pytest.mark.parametrize("result, says", [
    (lambda x: torch.relu(x.cpu()), "a tensor on cpu"),
    (lambda x: torch.relu(x).double(), "Double[3] where the op's meta kernel gives Float[3]"),
    (lambda x: torch.relu(x)[:2], "Float[2] where the op's meta kernel gives Float[3]"),
    (lambda x: None, "None where the op returns a Tensor"),
    (lambda x: (x, x), "tuple where the op returns Tensor"),
])
def test_a_wrong_override_result_is_refused_naming_the_override(result, says):
    def broken_relu(x):
        return result(x)

    x = torch.tensor([-1.0, 2.0, 3.0], device=DEVICE)
    with max_device.override("aten::relu", broken_relu):
        with pytest.raises(max_device.KernelError) as info:
            torch.relu(x)
    message = str(info.value)
    assert "override:" in message and "broken_relu" in message and "aten::relu" in message
    assert says in message, message
    assert torch.relu(x).tolist() == [0.0, 2.0, 3.0]


def test_an_out_override_must_return_its_out_argument():
    def new_tensor(self, other, *, alpha=1, out):
        return torch.add(self, other, alpha=alpha)  # computed, but not into `out`

    a = torch.ones(3, device=DEVICE)
    with max_device.override("aten::add.out", new_tensor):
        with pytest.raises(max_device.KernelError, match="returns its argument 'out'"):
            torch.add(a, a, out=torch.empty(3, device=DEVICE))
