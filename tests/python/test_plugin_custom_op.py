"""Ops a plugin defines: sdk_example's myplug::rms_norm, and the custom_op
fixtures' fixture_ns::negate.out. A definition outlives its plugin (PyTorch
cannot safely drop a schema that Python holds or another thread calls):
calls then raise PluginStateError naming the plugin, its schema cannot
change, and loading a plugin that serves it brings it back."""

import threading

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


def test_unload_leaves_the_op_defined_and_load_serves_it_again(load_plugin, plugin_file):
    path = plugin_file("sdk_example")
    x, w = torch.randn(2, 8), torch.randn(8)
    for _ in range(2):
        plugin = load_plugin(path)
        kept = torch.ops.myplug.rms_norm.default  # held by Python across the unload
        assert "myplug::rms_norm" in plugin.defines
        torch.testing.assert_close(torch.ops.myplug.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6).cpu(),
                                   rms_norm_reference(x, w, 1e-6))
        report = max_device.unload_plugin(plugin)
        assert report == {"name": "sdk_example", "unmapped": True}
        for op in (kept, torch.ops.myplug.rms_norm, torch.ops.myplug.rms_norm.default):
            with pytest.raises(max_device.PluginStateError) as info:
                op(x.to(DEVICE), w.to(DEVICE), 1e-6)
            e = info.value
            assert (e.plugin, e.op, e.file) == ("sdk_example", "myplug::rms_norm", path)
            assert "was unloaded" in str(e)
        assert "myplug::rms_norm" not in [e["op"] for e in max_device.list_ops()]


def test_calls_racing_loads_and_unloads_never_crash(load_plugin, plugin_file):
    """One thread calls the plugin's op (a kept overload and the packet)
    while another loads and unloads the plugin: every call either returns
    the right result or raises PluginStateError."""
    path = plugin_file("sdk_example")
    load_plugin(path)
    kept = torch.ops.myplug.rms_norm.default
    max_device.unload_plugin("sdk_example")
    x, w = torch.randn(4, 8), torch.randn(8)
    expected = rms_norm_reference(x, w, 1e-6)
    xd, wd = x.to(DEVICE), w.to(DEVICE)
    stop, outcomes, failures = threading.Event(), {"served": 0, "unloaded": 0}, []

    def call():
        while not stop.is_set():
            for op in (kept, torch.ops.myplug.rms_norm):
                try:
                    torch.testing.assert_close(op(xd, wd, 1e-6).cpu(), expected)
                    outcomes["served"] += 1
                except max_device.PluginStateError:
                    outcomes["unloaded"] += 1
                except Exception as e:  # noqa: BLE001 - anything else is the bug
                    failures.append(repr(e))
                    return

    caller = threading.Thread(target=call)
    caller.start()
    try:
        for _ in range(40):
            plugin = load_plugin(path)
            max_device.unload_plugin(plugin)
    finally:
        stop.set()
        caller.join(timeout=60)
    assert not caller.is_alive() and failures == []
    assert outcomes["served"] + outcomes["unloaded"] > 0


def test_python_registrations_on_plugin_ops_survive_unload_and_load(load_plugin, plugin_file):
    """register_fake and register_autograd on a plugin-defined op: unloading
    and loading the plugin again works and keeps both."""
    path = plugin_file("sdk_example")
    load_plugin(path)
    op = torch.ops.myplug.rms_norm.default
    # Registered through a Library this test destroys: the approximate
    # backward below must not reach later tests (check_plugin compares
    # rms_norm's gradients with the CPU's).
    lib = torch.library.Library("myplug", "FRAGMENT")

    @torch.library.register_fake("myplug::rms_norm", lib=lib)
    def _(x, weight, eps):
        return torch.empty_like(x)

    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad * weight / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps), None, None

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.eps = inputs[2]

    torch.library.register_autograd("myplug::rms_norm", backward, setup_context=setup_context, lib=lib)
    try:
        for _ in range(2):
            max_device.unload_plugin("sdk_example")
            load_plugin(path)
            with torch._subclasses.fake_tensor.FakeTensorMode():
                fake = op(torch.empty(3, 8), torch.empty(8), 1e-6)
            assert fake.shape == (3, 8)
            x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
            op(x, torch.ones(8, device=DEVICE), 1e-6).sum().backward()
            assert x.grad is not None and x.grad.device.type == DEVICE
    finally:
        lib._destroy()


def test_changed_schema_refused(load_plugin, fixture_file):
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

    # Unloading the definer does not free the name: the schema stays.
    max_device.unload_plugin(custom_op)
    with pytest.raises(max_device.SchemaError, match="restart the process"):
        load_plugin(changed)
    assert str(torch.ops.fixture_ns.negate.out._schema) == schema


def test_same_schema_from_second_plugin_layers(load_plugin, fixture_file, tmp_path):
    """custom_op loaded twice under two names: the same schema is accepted,
    and the op is served until both are gone."""
    a = load_plugin(fixture_file("custom_op"))
    b = load_plugin(fixture_file("custom_op"), name="custom_op_2")
    entry = next(e for e in max_device.list_ops() if e["op"] == "fixture_ns::negate.out")
    assert [l["owner"] for l in entry["layers"]] == ["custom_op@1.0.0", "custom_op_2@1.0.0"]
    x = torch.randn(3)
    out = torch.empty(3, device=DEVICE)
    max_device.unload_plugin(b)
    torch.ops.fixture_ns.negate(x.to(DEVICE), out=out)
    torch.testing.assert_close(out.cpu(), -x)
    max_device.unload_plugin(a)
    with pytest.raises(max_device.PluginStateError, match="plugin 'custom_op'"):
        torch.ops.fixture_ns.negate(x.to(DEVICE), out=out)
