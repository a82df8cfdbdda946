"""The CPU fallback runs the CPU kernel on the device tensor's own bytes and
adopts the kernel's output buffer: no copy either way."""

import pytest
import torch

import max_device

DEVICE = "max_device"

_lib = torch.library.Library("max_device_zc_test", "DEF")
_lib.define("record(Tensor x) -> Tensor")
_lib.define("record_inplace(Tensor(a!) x) -> ()")

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


_lib.impl("record", _record_cpu, "CPU")
_lib.impl("record_inplace", _record_inplace_cpu, "CPU")


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
