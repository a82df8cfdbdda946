"""The CPU fallback runs the CPU kernel on the device tensor's own bytes and
adopts the kernel's output buffer: no copy either way. The CPU aliases it
makes for arguments are reused by the thread's next calls when nothing else
holds them: reuse must never show."""

import threading

import pytest
import torch

import max_device

DEVICE = "max_device"

_lib = torch.library.Library("max_device_zc_test", "DEF")
_lib.define("record(Tensor x) -> Tensor")
_lib.define("record_inplace(Tensor(a!) x) -> ()")
_lib.define("keep(Tensor x) -> Tensor")
_lib.define("halves(Tensor x) -> (Tensor, Tensor)")
_lib.define("stash(Tensor x) -> Tensor")

SEEN = {}


def _record_cpu(x):
    assert x.device.type == "cpu"
    SEEN["input_ptr"] = x.data_ptr()
    SEEN["input_storage_ptr"] = x.untyped_storage().data_ptr()
    SEEN["input_layout"] = (tuple(x.shape), x.stride(), x.storage_offset())
    out = x * 2  # a fresh CPU allocation
    SEEN["output_ptr"] = out.data_ptr()
    return out


def _record_inplace_cpu(x):
    SEEN["inplace_ptr"] = x.data_ptr()
    x.add_(100)


def _keep_cpu(x):
    SEEN["kept"] = x + 1  # the kernel holds on to its result
    return SEEN["kept"]


def _halves_cpu(x):
    both = x * 3  # one fresh buffer, two results over it
    return both[: len(x) // 2], both[len(x) // 2:]


_lib.impl("record", _record_cpu, "CPU")
_lib.impl("record_inplace", _record_inplace_cpu, "CPU")
_lib.impl("keep", _keep_cpu, "CPU")
def _stash_cpu(x):
    SEEN.setdefault("stashed", []).append(x)  # the kernel keeps its argument
    return x.sum()


_lib.impl("halves", _halves_cpu, "CPU")
_lib.impl("stash", _stash_cpu, "CPU")


@pytest.fixture(autouse=True)
def clear_seen():
    SEEN.clear()


def test_input_is_not_copied_and_output_is_adopted():
    d = torch.arange(1000.0).to(DEVICE)
    out = torch.ops.max_device_zc_test.record(d)
    assert out.device.type == DEVICE
    assert SEEN["input_ptr"] == d.data_ptr()
    assert out.data_ptr() == SEEN["output_ptr"]
    torch.testing.assert_close(out.cpu(), torch.arange(1000.0) * 2)
    assert max_device.fallback_counts()["max_device_zc_test::record"] == 1


def test_view_input_keeps_storage_offset_and_strides():
    base = torch.arange(60.0).reshape(6, 10).to(DEVICE)
    v = base[1:5, 2:8:2].t()
    out = torch.ops.max_device_zc_test.record(v)
    # the CPU kernel saw the whole device storage, same offset and strides
    assert SEEN["input_storage_ptr"] == base.untyped_storage().data_ptr()
    assert SEEN["input_ptr"] == v.data_ptr()
    assert SEEN["input_layout"] == (tuple(v.shape), v.stride(), v.storage_offset())
    torch.testing.assert_close(out.cpu(), v.cpu() * 2)


def test_mutation_lands_in_the_device_tensor():
    d = torch.zeros(8).to(DEVICE)
    ptr = d.data_ptr()
    torch.ops.max_device_zc_test.record_inplace(d[2:5])
    assert SEEN["inplace_ptr"] == ptr + 2 * 4
    assert d.data_ptr() == ptr
    assert d.tolist() == [0, 0, 100, 100, 100, 0, 0, 0]


def test_adopted_output_memory_is_accounted_and_freed():
    d = torch.ones(1 << 16).to(DEVICE)
    before = torch.max_device.memory_allocated()
    out = torch.ops.max_device_zc_test.record(d)
    assert torch.max_device.memory_allocated() - before >= out.nbytes
    assert out.untyped_storage().device.type == DEVICE
    del out
    assert torch.max_device.memory_allocated() == before


def test_an_output_the_kernel_still_holds_stays_a_cpu_tensor_for_it():
    # A fresh result nothing else holds becomes the device tensor itself; one
    # the kernel keeps must stay a CPU tensor for its holder, over the same bytes.
    d = torch.arange(4.0).to(DEVICE)
    out = torch.ops.max_device_zc_test.keep(d)
    kept = SEEN["kept"]
    assert kept.device.type == "cpu" and out.device.type == DEVICE
    assert out.data_ptr() == kept.data_ptr()
    out.mul_(10)
    assert kept.tolist() == [10.0, 20.0, 30.0, 40.0]


def test_outputs_over_one_buffer_share_one_device_storage():
    d = torch.arange(6.0).to(DEVICE)
    first, second = torch.ops.max_device_zc_test.halves(d)
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert first.untyped_storage().device.type == DEVICE
    second.fill_(-1)  # one storage: a write through one result shows in the other's base
    assert first.tolist() == [0.0, 3.0, 6.0]
    assert torch.as_strided(first, (6,), (1,), 0).tolist() == [0.0, 3.0, 6.0, -1.0, -1.0, -1.0]


def test_aten_non_structured_op_output_is_adopted():
    d = torch.randn(100, 10).to(DEVICE)
    idx = torch.tensor([3, 1, 4]).to(DEVICE)
    out = torch.index_select(d, 0, idx)
    assert out.device.type == DEVICE
    assert out.untyped_storage().device.type == DEVICE
    # in-place through the fallback writes the device tensor's own bytes
    ptr = d.data_ptr()
    d.relu_()
    assert d.data_ptr() == ptr
    assert (d.cpu() >= 0).all()


def test_copying_fallback_baseline_still_correct():
    max_device._C._set_fallback_impl("copying")
    d = torch.arange(10.0).to(DEVICE)
    out = torch.index_select(d, 0, torch.tensor([9, 0]).to(DEVICE))
    assert out.tolist() == [9.0, 0.0]
    # the copying fallback hands the kernel a copy: the pointer differs
    torch.ops.max_device_zc_test.record(d)
    assert SEEN["input_ptr"] != d.data_ptr()
    with pytest.raises(ValueError):
        max_device._C._set_fallback_impl("nope")


def fallback_calls(op):
    return max_device.fallback_counts().get(op, 0)


def test_an_argument_the_kernel_keeps_goes_on_reading_its_own_tensor():
    d = torch.arange(8.0).to(DEVICE)
    torch.ops.max_device_zc_test.stash(d)
    kept = SEEN["stashed"][0]
    calls = fallback_calls("aten::atan2")
    for i in range(20):  # later calls on other tensors, on this thread
        other = torch.full((8,), float(i)).to(DEVICE)
        torch.atan2(other, other)
    assert fallback_calls("aten::atan2") == calls + 20
    assert kept.device.type == "cpu" and kept.data_ptr() == d.data_ptr()
    d.add_(1)
    assert kept.tolist() == [float(i + 1) for i in range(8)]


def test_a_tensor_a_call_read_is_freed_with_its_last_reference():
    before = torch.max_device.memory_allocated()
    d = torch.ones(1 << 20).to(DEVICE)
    result = torch.atan2(d, d)
    del d, result
    # the call's argument aliases stay for reuse, not the bytes they pointed at
    assert torch.max_device.memory_allocated() == before


def test_reused_aliases_take_each_arguments_dtype_geometry_and_bits():
    g = torch.Generator().manual_seed(0)
    bases = [torch.randn(3, 4, generator=g), torch.randn(4, 3, generator=g), torch.arange(40.0),
             torch.randn(5, dtype=torch.complex64, generator=g), torch.randint(-9, 9, (6,), generator=g),
             torch.randn(2, 3, 4, generator=g).double(), torch.tensor(3.5)]
    views = [  # taken on each device, so the device tensors carry the bits too
        lambda b: b[0],
        lambda b: b[1].t(),  # the same shape as the first, other strides
        lambda b: b[2].reshape(4, 10)[1:, 2::3],  # an offset
        lambda b: b[3].conj(),  # the conjugate bit
        lambda b: b[3].conj().imag,  # the negative bit
        lambda b: b[4],
        lambda b: b[5].permute(2, 0, 1),
        lambda b: b[6],
    ]
    on_device = [t.to(DEVICE) for t in bases]
    assert views[3](on_device).is_conj() and views[4](on_device).is_neg()
    def mul_fallbacks():  # mul.Tensor itself, or mul.out under PyTorch's composite
        return fallback_calls("aten::mul.Tensor") + fallback_calls("aten::mul.out")

    calls = mul_fallbacks()
    for _ in range(3):  # later rounds run on aliases parked by earlier ones
        for view in views:
            t, d = view(bases), view(on_device)
            got = torch.mul(d, d.clone()).cpu()
            assert torch.equal(got, t * t), (t.dtype, t.shape, t.stride())
    assert mul_fallbacks() >= calls + 3 * len(views)


def test_inference_mode_calls_and_normal_calls_mix_on_one_thread():
    x = torch.randn(6).to(DEVICE)
    expected = torch.atan2(x.cpu(), x.cpu())
    normal = torch.atan2(x, x)
    with torch.inference_mode():
        inferred = torch.atan2(x, x)
    again = torch.atan2(x, x)
    assert inferred.is_inference() and not normal.is_inference() and not again.is_inference()
    again.add_(1)  # in place outside inference mode: only allowed on a normal tensor
    for got in (normal, inferred, again - 1):
        torch.testing.assert_close(got.cpu(), expected)


def test_threads_calling_the_fallback_and_exiting():
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(100):
                a, b = torch.randn(33, generator=g), torch.randn(33, generator=g)
                got = torch.atan2(a.to(DEVICE), b.to(DEVICE)).cpu()
                if not torch.equal(got, torch.atan2(a, b)):
                    errors.append(seed)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    for _ in range(2):  # new threads after the first ones exited with their pools
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


# A call with this many tensors finds its aliases through an index (a scan of
# the others was quadratic); every sharing case must still hold there.
MANY = 40


def _many_tensors(seed):
    """MANY tensors for one call: separate ones, views over one storage, and
    one tensor listed several times."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(MANY, 3, generator=g)
    separate = [torch.randn(3, generator=g) for _ in range(MANY // 2)]
    views = [shared[i] for i in range(MANY // 4)]
    return separate + views + [separate[0]] * (MANY - len(separate) - len(views)), shared


def test_a_call_with_many_tensors_reads_each_as_its_own_tensor():
    cpu_list, cpu_shared = _many_tensors(1)
    # The same structure on the device: views of one device storage, one
    # device tensor repeated.
    d_shared = cpu_shared.to(DEVICE)
    d_separate = [t.to(DEVICE) for t in cpu_list[:MANY // 2]]
    d_list = d_separate + [d_shared[i] for i in range(MANY // 4)] + [d_separate[0]] * (MANY - MANY // 2 - MANY // 4)
    calls = fallback_calls("aten::cat")
    for _ in range(2):  # the second call takes the aliases the first parked
        got = torch.cat(d_list)
        assert got.device.type == DEVICE and torch.equal(got.cpu(), torch.cat(cpu_list))
    assert fallback_calls("aten::cat") == calls + 2


def test_an_out_argument_after_many_inputs_is_resized_on_the_device():
    cpu_list, _ = _many_tensors(3)
    d_list = [t.to(DEVICE) for t in cpu_list]
    out = torch.empty(0, device=DEVICE)
    torch.cat(d_list, out=out)
    assert out.device.type == DEVICE and torch.equal(out.cpu(), torch.cat(cpu_list))
    assert torch.accelerator.memory_allocated() >= out.nbytes


def test_a_fused_optimizer_step_over_many_parameters_writes_each_through():
    g = torch.Generator().manual_seed(4)
    # Parameters over one storage (a flat buffer's views), and one gradient
    # listed for every parameter.
    flat, grad = torch.randn(MANY, 3, generator=g), torch.randn(3, generator=g)
    state = {"exp_avgs": [torch.zeros(3) for _ in range(MANY)],
             "exp_avg_sqs": [torch.zeros(3) for _ in range(MANY)],
             "max_exp_avg_sqs": [], "state_steps": [torch.tensor(0.0) for _ in range(MANY)]}
    d_flat, d_grad = flat.to(DEVICE), grad.to(DEVICE)
    d_state = {k: [t.to(DEVICE) for t in v] for k, v in state.items()}
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=1e-2, eps=1e-8, amsgrad=False, maximize=False)
    calls = fallback_calls("aten::_fused_adamw_")
    for _ in range(3):
        for steps in (state["state_steps"], d_state["state_steps"]):
            torch._foreach_add_(steps, 1)
        torch._fused_adamw_(list(flat), [grad] * MANY, *state.values(), **hyper)
        torch._fused_adamw_(list(d_flat), [d_grad] * MANY, *d_state.values(), **hyper)
    assert fallback_calls("aten::_fused_adamw_") == calls + 3
    assert torch.equal(d_flat.cpu(), flat) and torch.equal(d_grad.cpu(), grad)
    for got, expected in zip(d_state["exp_avg_sqs"], state["exp_avg_sqs"]):
        assert torch.equal(got.cpu(), expected)
