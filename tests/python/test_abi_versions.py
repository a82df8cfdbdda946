"""ABI 1.1 on a host that also loads 1.0 plugins: the old kernel table at
its own stride, and the host's resize_output for out= tensors. ABI 1.3's
bool[] values never reach a plugin built before them."""

import pytest
import torch

import max_device

from conftest import op_stats

DEVICE = "max_device"


def test_a_plugin_built_at_abi_1_0_loads_and_every_kernel_runs(load_plugin, fixture_file):
    plugin = load_plugin(fixture_file("abi_1_0"))
    assert plugin.abi == "1.0" and plugin.ops == ["aten::neg.out", "aten::abs.out"]
    x = torch.tensor([-1.5, 2.0, -3.0])
    assert torch.neg(x.to(DEVICE)).cpu().tolist() == [1.5, -2.0, 3.0]
    out = torch.empty(3, device=DEVICE)
    torch.abs(x.to(DEVICE), out=out)  # the second 48-byte entry of the table
    assert out.cpu().tolist() == [1.5, 2.0, 3.0]
    assert op_stats("aten::abs.out")[0] == 1


@pytest.mark.parametrize("out_shape", [(0,), (2, 2), (7,)])
def test_resize_output_follows_pytorchs_out_rules(load_plugin, plugin_file, out_shape):
    load_plugin(plugin_file("sdk_example"))  # its silu.out resizes out= through the host
    x = torch.randn(5)
    out = torch.empty(out_shape, device=DEVICE)
    # (a non-empty one with PyTorch's deprecation warning, as on the CPU)
    result = torch.ops.aten.silu.out(x.to(DEVICE), out=out)
    assert result is out and out.shape == (5,)
    torch.testing.assert_close(out.cpu(), torch.nn.functional.silu(x))
    assert op_stats("aten::silu.out")[0] == 1


def test_a_plugin_built_before_abi_1_3_is_refused_an_op_taking_a_bool_list(fixture_file):
    with pytest.raises(max_device.PluginError,
                       match=r"native_layer_norm_backward.*bool\[\].*built against ABI 1\.2"):
        max_device.load_plugin(fixture_file("bool_list_at_abi_1_2"))
    assert all(p.name != "bool_list_at_abi_1_2" for p in max_device.list_plugins())


def test_resize_output_never_resizes_an_out_tensor_that_is_also_an_input(load_plugin, plugin_file):
    load_plugin(plugin_file("fast"))  # its mul.out resizes out= through the host
    other = torch.ones(3, 1)
    for device in ("cpu", DEVICE):
        for call in (lambda x, y: torch.mul(x, y, out=x), lambda x, y: x.ldexp_(y.long())):
            x = torch.empty(0, 1, 3, device=device)
            with pytest.raises(RuntimeError,
                               match=r"output with shape \[0, 1, 3\] doesn't match the broadcast shape \[0, 3, 3\]"
                               ) as raised:
                call(x, other.to(device))
            assert type(raised.value) is RuntimeError  # PyTorch's own error, not a KernelError
            assert x.shape == (0, 1, 3)
    assert op_stats("aten::mul.out")[0] >= 1  # the plugin's kernel was reached on max_device


@pytest.mark.parametrize("served_by", ["plugin", "fallback"])
def test_an_out_tensor_whose_storage_cannot_grow_is_not_resized(load_plugin, plugin_file, served_by):
    # (The CPU itself crashes here: torch 2.13 resizes a shared-memory CPU
    # storage through a null allocator. max_device raises PyTorch's error.)
    if served_by == "plugin":
        load_plugin(plugin_file("sdk_example"))  # its silu.out resizes out= through the host
    calls = op_stats("aten::silu.out")[0]
    out = torch.zeros(2, device=DEVICE).share_memory_()  # moved to shared memory: not resizable
    with pytest.raises(RuntimeError, match="Trying to resize storage that is not resizable") as raised:
        torch.ops.aten.silu.out(torch.randn(5, device=DEVICE), out=out)
    assert type(raised.value) is RuntimeError and out.shape == (2,)
    assert op_stats("aten::silu.out")[0] == calls + (served_by == "plugin")
