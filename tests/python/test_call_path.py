"""The call path to a plugin kernel: ops with a common C++ signature are
called unboxed (as the dispatcher calls a native kernel), every other op
boxed; both reach the same providers, counters, declines and fallback."""

import pytest
import torch

import max_device
from conftest import op_stats

DEVICE = "max_device"


def call_paths(plugin):
    return {e["op"]: e["call_path"] for e in max_device.list_ops(plugin)}


def test_common_signatures_are_called_unboxed(plugin_file, load_plugin):
    paths = call_paths(load_plugin(plugin_file("reference")))
    for op in ["aten::add.out", "aten::add.Tensor", "aten::add_.Tensor", "aten::relu", "aten::relu_",
               "aten::sum.IntList_out", "aten::mean.out", "aten::_softmax.out",
               "aten::_softmax_backward_data.out", "aten::gelu.out", "aten::addmm.out", "reference::version"]:
        assert paths[op] == "unboxed", (op, paths[op])


def test_other_signatures_are_called_boxed_and_still_served(plugin_file, load_plugin):
    plugin = load_plugin(plugin_file("sdk_example"))
    paths = call_paths(plugin)
    assert paths["myplug::rms_norm"] == "boxed"  # (Tensor, Tensor, float): no unboxed shape
    assert paths["aten::silu.out"] == "unboxed"
    x, w = torch.randn(4, 16), torch.randn(16)
    got = torch.ops.myplug.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(got.cpu(), want)
    assert op_stats("myplug::rms_norm")[0] == 1


# The same op called both ways: torch.relu / torch.add go through PyTorch's
# C++ API (unboxed); torch.ops.aten.<op>.<overload> is a boxed call, which
# the dispatcher unboxes again for an op whose trampoline is unboxed (the
# boxed trampoline serves the ops of other signatures: the tests at the end).
CALLS = {
    "unboxed": {"relu": torch.relu, "add_out": lambda a, b, out: torch.add(a, b, alpha=2, out=out)},
    "boxed": {"relu": torch.ops.aten.relu.default,
              "add_out": lambda a, b, out: torch.ops.aten.add.out(a, b, alpha=2, out=out)},
}


@pytest.mark.parametrize("path", ["unboxed", "boxed"])
def test_both_paths_serve_decline_and_fall_back_alike(plugin_file, load_plugin, path):
    load_plugin(plugin_file("reference"))
    relu, add_out = CALLS[path]["relu"], CALLS[path]["add_out"]
    x = torch.randn(64)

    # Served: one call counted, the plugin's result.
    assert relu(x.to(DEVICE)).cpu().equal(torch.relu(x))
    assert op_stats("aten::relu") == (1, 0, 0)
    # Declined by its capabilities (float32 only): the CPU kernel serves it.
    i = torch.arange(-5, 5)
    assert relu(i.to(DEVICE)).cpu().equal(torch.relu(i))
    assert op_stats("aten::relu") == (1, 1, 1)

    # out=: served into the user's tensor, returned as the same tensor.
    a, b = torch.randn(8, 3), torch.randn(8, 3)
    out = torch.empty(8, 3, device=DEVICE)
    assert add_out(a.to(DEVICE), b.to(DEVICE), out) is out
    torch.testing.assert_close(out.cpu(), a + 2 * b)
    assert op_stats("aten::add.out") == (1, 0, 0)
    # An out= of the wrong size (the reference kernel declines it) and a
    # dtype it declines: the CPU kernel resizes and writes the same tensor.
    out = torch.empty(0, device=DEVICE)
    assert add_out(a.to(DEVICE), b.to(DEVICE), out) is out and out.shape == (8, 3)
    torch.testing.assert_close(out.cpu(), a + 2 * b)
    ai, bi = torch.arange(6), torch.arange(6, 12)
    out = torch.empty(0, dtype=torch.int64, device=DEVICE)
    assert add_out(ai.to(DEVICE), bi.to(DEVICE), out) is out and out.cpu().equal(ai + 2 * bi)
    assert op_stats("aten::add.out") == (1, 2, 2)


def test_both_paths_raise_the_same_kernel_error(fixture_file, load_plugin):
    path = fixture_file("failing_kernel")  # its neg.out fails on purpose
    load_plugin(path)
    x = torch.randn(4, device=DEVICE)
    messages = []
    for call in (lambda: torch.neg(x, out=torch.empty_like(x)),
                 lambda: torch.ops.aten.neg.out(x, out=torch.empty_like(x))):
        with pytest.raises(max_device.KernelError) as info:
            call()
        messages.append(str(info.value))
    assert messages == [f"plugin 'failing_kernel', op aten::neg.out ({path}): fixture kernel failed on purpose"] * 2
    assert op_stats("aten::neg.out")[:2] == (2, 0)


@pytest.mark.parametrize("path", ["unboxed", "boxed"])
def test_both_paths_serve_on_the_device_of_the_call(plugin_file, load_plugin, path):
    load_plugin(plugin_file("reference"))
    relu, add_out = CALLS[path]["relu"], CALLS[path]["add_out"]
    x = torch.randn(16)
    current = torch.max_device.current_device()
    other = f"max_device:{1 - current}"
    got = relu(x.to(other))  # the plugin allocates its output on the tensors' device
    assert got.device == torch.device(other) and got.cpu().equal(torch.relu(x))
    assert torch.max_device.current_device() == current  # restored after the call
    assert op_stats("aten::relu")[:2] == (1, 0)
    with pytest.raises(RuntimeError, match=r"on the same device.*aten::add\.out"):
        add_out(x.to(DEVICE), x.to(other), torch.empty(16, device=DEVICE))
    assert op_stats("aten::add.out")[:2] == (0, 0)  # refused before any provider ran


# A call's ABI values live in buffers sized before the first argument is
# added (inline for a common call), so that no value moves once a kernel
# may point at it. These calls pass more than those inline buffers hold.

def test_an_int_list_longer_than_the_inline_buffers_reaches_the_kernel_unboxed(plugin_file, load_plugin):
    plugin = load_plugin(plugin_file("reference"))
    assert call_paths(plugin)["aten::sum.IntList_out"] == "unboxed"  # the list is borrowed from the caller
    x = torch.randn([2] * 10)
    dims = [9, 0, 8, 1, 7, 2, 6, 3, 5]  # nine dims, out of order: the kernel reads every one
    out = torch.empty(2, device=DEVICE)
    torch.sum(x.to(DEVICE), dims, out=out)
    torch.testing.assert_close(out.cpu(), x.sum(dims))
    assert op_stats("aten::sum.IntList_out")[:2] == (1, 0)


def test_an_int_list_longer_than_the_inline_buffers_reaches_the_kernel_boxed(plugin_file, load_plugin):
    plugin = load_plugin(plugin_file("fast"))
    assert call_paths(plugin)["aten::native_layer_norm"] == "boxed"  # SymInt[]: the list is copied
    x, w, b = torch.randn([2] * 10), torch.randn([2] * 9), torch.randn([2] * 9)
    got = torch.nn.functional.layer_norm(x.to(DEVICE), [2] * 9, w.to(DEVICE), b.to(DEVICE))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.layer_norm(x, [2] * 9, w, b))
    assert op_stats("aten::native_layer_norm")[:2] == (1, 0)


def test_a_string_longer_than_the_inline_buffer_reaches_the_kernel(plugin_file, load_plugin):
    plugin = load_plugin(plugin_file("reference"))
    assert call_paths(plugin)["aten::gelu.out"] == "unboxed"  # the string is copied, NUL-terminated
    x = torch.randn(8)
    mode = "tanh-but-spelled-out-at-length"  # past the 16 inline bytes; no gelu mode
    with pytest.raises(RuntimeError) as on_cpu:
        torch.nn.functional.gelu(x, approximate=mode, out=torch.empty(8))
    # The kernel reads it whole and declines it; the CPU kernel raises its own error.
    with pytest.raises(RuntimeError) as on_device:
        torch.nn.functional.gelu(x.to(DEVICE), approximate=mode, out=torch.empty(8, device=DEVICE))
    assert str(on_device.value) == str(on_cpu.value)
    assert op_stats("aten::gelu.out") == (0, 1, 1)


def test_tensor_lists_longer_than_the_inline_buffers_reach_the_kernel(plugin_file, load_plugin):
    plugin = load_plugin(plugin_file("fast"))
    assert call_paths(plugin)["aten::_fused_adamw_"] == "boxed"
    shapes = [(3, 5), (7,), (2, 2, 2), (11,), (1,), (4, 3), (6,), (5, 5), (9,), (2, 7), (8,), (3, 3)]
    torch.manual_seed(0)
    lists = [[torch.randn(s) for s in shapes] for _ in range(4)]  # params, grads, exp_avgs, exp_avg_sqs
    lists[3] = [v.abs() for v in lists[3]]
    steps = [torch.tensor(3.0) for _ in shapes]
    on_device = [[t.to(DEVICE) for t in ts] for ts in lists] + [[s.to(DEVICE) for s in steps]]

    def step(ts, steps):
        torch._fused_adamw_(ts[0], ts[1], ts[2], ts[3], [], steps, lr=1e-2, beta1=0.9, beta2=0.999,
                            weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)

    step(on_device, on_device[4])
    step(lists, steps)
    for got, want in zip(on_device[:4], lists):
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w)
    assert op_stats("aten::_fused_adamw_")[:2] == (1, 0)
