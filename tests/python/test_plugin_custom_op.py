"""Ops a plugin defines: sdk_example's myplug::rms_norm, and the custom_op
fixtures' fixture_ns::negate.out (a schema can only change once the plugin
that defined it is unloaded)."""

import pytest
import torch

import max_device
from conftest import op_stats

DEVICE = "max_device"


def rms_norm_reference(x, weight, eps):
    x64 = x.double()
    return (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).float()


@pytest.fixture
def sdk_example(load_plugin, plugin_file):
    return load_plugin(plugin_file("sdk_example"))


@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 3, 5), (0, 4)])
def test_rms_norm_matches_python(sdk_example, shape):
    x, w = torch.randn(*shape), torch.randn(shape[-1])
    y = torch.ops.myplug.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-5)
    assert y.device.type == DEVICE and y.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close(y.cpu(), rms_norm_reference(x, w, 1e-5))
    assert op_stats("myplug::rms_norm")[:2] == (1, 0)


def test_rms_norm_declared_by_plugin(sdk_example):
    assert sdk_example.defines == ["myplug::rms_norm", "myplug::swiglu", "myplug::swiglu_backward"]
    schema = str(torch.ops.myplug.rms_norm.default._schema)
    assert schema == "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"


def test_rms_norm_bad_weight_shape_raises_kernel_error(sdk_example, plugin_file):
    x, w = torch.randn(3, 4, device=DEVICE), torch.randn(3, device=DEVICE)
    with pytest.raises(max_device.KernelError) as info:
        torch.ops.myplug.rms_norm(x, w, 1e-6)
    e = info.value
    assert isinstance(e, RuntimeError)
    message = str(e)
    assert "weight must have shape [4]" in message
    assert "sdk_example" in message and "myplug::rms_norm" in message
    assert plugin_file("sdk_example") in message
    assert (e.plugin, e.op, e.file) == ("sdk_example", "myplug::rms_norm", plugin_file("sdk_example"))
    # the plugin is still there and still works
    torch.testing.assert_close(torch.ops.myplug.rms_norm(x, x[0], 1e-6).cpu(),
                               rms_norm_reference(x.cpu(), x[0].cpu(), 1e-6))


def test_rms_norm_declined_without_cpu_kernel(sdk_example):
    """A non-contiguous x is declined (CONTIGUOUS_ONLY); a custom op has no
    CPU kernel to fall to, so the call fails and names the op."""
    x = torch.randn(4, 3, device=DEVICE).t()
    with pytest.raises(NotImplementedError, match="myplug::rms_norm"):
        torch.ops.myplug.rms_norm(x, torch.randn(4, device=DEVICE), 1e-6)
    calls, declines, fallbacks = op_stats("myplug::rms_norm")
    assert (calls, declines) == (0, 1)


def test_unload_removes_op_and_reload_restores_it(load_plugin, plugin_file):
    path = plugin_file("sdk_example")
    x, w = torch.randn(2, 8), torch.randn(8)
    for _ in range(2):
        plugin = load_plugin(path)
        assert hasattr(torch.ops.myplug, "rms_norm")
        torch.testing.assert_close(torch.ops.myplug.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6).cpu(),
                                   rms_norm_reference(x, w, 1e-6))
        report = max_device.unload_plugin(plugin)
        assert report == {"name": "sdk_example", "unmapped": True}
        assert not hasattr(torch.ops.myplug, "rms_norm")
        with pytest.raises((AttributeError, RuntimeError)):
            torch.ops.myplug.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6)
        assert "myplug::rms_norm" not in [e["op"] for e in max_device.list_ops()]


def test_changed_schema_refused_while_definer_loaded(load_plugin, fixture_file):
    custom_op = load_plugin(fixture_file("custom_op"))
    assert custom_op.defines == ["fixture_ns::negate.out"]
    x = torch.randn(5)
    out = torch.empty(5, device=DEVICE)
    torch.ops.fixture_ns.negate(x.to(DEVICE), out=out)
    torch.testing.assert_close(out.cpu(), -x)

    ops_before = max_device.list_ops()
    plugins_before = [p.name for p in max_device.list_plugins()]
    changed = fixture_file("custom_op_changed")
    with pytest.raises(max_device.SchemaError) as info:
        load_plugin(changed)
    e = info.value
    assert (e.plugin, e.op, e.file) == ("custom_op_changed", "fixture_ns::negate.out", changed)
    for part in ("custom_op_changed", "fixture_ns::negate.out", changed, "custom_op'"):
        assert part in str(e)
    assert max_device.list_ops() == ops_before
    assert [p.name for p in max_device.list_plugins()] == plugins_before
    schema = str(torch.ops.fixture_ns.negate.out._schema)
    assert schema == "fixture_ns::negate.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)"

    max_device.unload_plugin(custom_op)
    assert not hasattr(torch.ops.fixture_ns, "negate")
    plugin = load_plugin(changed)
    assert plugin.defines == ["fixture_ns::negate.out"]
    assert "int unused=0" in str(torch.ops.fixture_ns.negate.out._schema)
    out = torch.empty(5, device=DEVICE)
    torch.ops.fixture_ns.negate(x.to(DEVICE), out=out, unused=3)
    torch.testing.assert_close(out.cpu(), -x)
    max_device.unload_plugin(plugin)


def test_same_schema_from_second_plugin_layers(load_plugin, fixture_file, tmp_path):
    """custom_op loaded twice under two names: the same schema is accepted
    and the op keeps its definition until both are gone."""
    a = load_plugin(fixture_file("custom_op"))
    b = load_plugin(fixture_file("custom_op"), name="custom_op_2")
    entry = next(e for e in max_device.list_ops() if e["op"] == "fixture_ns::negate.out")
    assert [l["owner"] for l in entry["layers"]] == ["custom_op@1.0.0", "custom_op_2@1.0.0"]
    max_device.unload_plugin(b)
    assert hasattr(torch.ops.fixture_ns, "negate")
    max_device.unload_plugin(a)
    assert not hasattr(torch.ops.fixture_ns, "negate")
