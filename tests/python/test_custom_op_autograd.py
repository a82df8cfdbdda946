"""Custom ops that need no Python: a meta function (FakeTensor, opcheck,
torch.compile tracing) and an autograd link to a backward op, both from the
plugin (sdk_example's myplug::swiglu)."""

import pytest
import torch

import max_device

DEVICE = "max_device"


@pytest.fixture
def sdk_example(load_plugin, plugin_file):
    return load_plugin(plugin_file("sdk_example"))


def test_opcheck_passes_every_test(sdk_example):
    gate, up = torch.randn(4, 6, device=DEVICE), torch.randn(4, 6, device=DEVICE)
    results = torch.library.opcheck(torch.ops.myplug.swiglu.default, (gate, up))
    assert set(results.values()) == {"SUCCESS"}
    assert {"test_schema", "test_faketensor", "test_aot_dispatch_dynamic"} <= set(results)
    x, w = torch.randn(3, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    assert set(torch.library.opcheck(torch.ops.myplug.rms_norm.default, (x, w, 1e-5)).values()) == {"SUCCESS"}


def test_gradcheck_passes_in_float64(sdk_example):
    gate = torch.randn(3, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    up = torch.randn(3, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.myplug.swiglu.default, (gate, up))


def test_gradients_match_pytorch_and_the_backward_runs_on_the_plugin(sdk_example):
    gate, up = torch.randn(2, 7), torch.randn(2, 7)
    g_cpu, u_cpu = gate.clone().requires_grad_(), up.clone().requires_grad_()
    (torch.nn.functional.silu(g_cpu) * u_cpu).sum().backward()
    g, u = gate.to(DEVICE).requires_grad_(), up.to(DEVICE).requires_grad_()
    y = torch.ops.myplug.swiglu(g, u)
    assert y.grad_fn.name() == "myplug::swigluBackward"
    y.sum().backward()
    torch.testing.assert_close(g.grad.cpu(), g_cpu.grad)
    torch.testing.assert_close(u.grad.cpu(), u_cpu.grad)
    calls = {e["op"]: sum(l["calls"] for l in e["layers"]) for e in max_device.list_ops(sdk_example)}
    assert calls["myplug::swiglu_backward"] == 1


def test_meta_tensors_get_shapes_from_the_meta_function(sdk_example):
    # what FakeTensor and torch.compile run for the op (opcheck's test_faketensor above)
    y = torch.ops.myplug.swiglu(torch.empty(5, 3, device="meta"), torch.empty(5, 3, device="meta"))
    assert y.shape == (5, 3) and y.device.type == "meta"
    calls = {e["op"]: sum(l["calls"] for l in e["layers"]) for e in max_device.list_ops(sdk_example)}
    assert calls["myplug::swiglu"] == 0  # no kernel ran


def test_a_meta_function_error_names_the_plugin_and_op(sdk_example):
    with pytest.raises(max_device.KernelError, match="sdk_example.*myplug::swiglu.*same shape"):
        torch.ops.myplug.swiglu(torch.empty(5, 3, device="meta"), torch.empty(5, 4, device="meta"))


def test_meta_and_autograd_kernels_go_with_the_plugin(load_plugin, plugin_file):
    plugin = load_plugin(plugin_file("sdk_example"))
    assert torch._C._dispatch_has_kernel_for_dispatch_key("myplug::swiglu", "Meta")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("myplug::swiglu", "Autograd")
    plugin.reload(force=True)  # the op stays defined; its kernels follow the new version
    gate = torch.randn(4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    torch.ops.myplug.swiglu(gate, torch.ones(4, dtype=torch.float64, device=DEVICE)).sum().backward()
    assert gate.grad is not None
    max_device.unload_plugin(plugin)
    # The op outlives the plugin (Python may hold it); a call names the unloaded plugin.
    with pytest.raises(max_device.PluginStateError, match="was unloaded"):
        torch.ops.myplug.swiglu(gate.detach(), torch.ones(4, dtype=torch.float64, device=DEVICE))
