"""PyTorch's own OpInfo database, run on max_device against the CPU.

Selection: every OpInfo of class UnaryUfuncInfo, BinaryUfuncInfo,
ReductionOpInfo or ShapeFuncInfo, plus the view/shape ops named in
VIEW_AND_SHAPE_OPS, for float32 and int64 where the op supports the dtype on
the CPU (pairs without CPU support are not generated). For each (op, dtype)
the first MAX_SAMPLES samples are built on the CPU, copied to max_device
(input, args, kwargs, recursively), run on both, and compared.

Tolerances: OpInfo has no per-op tolerance for "device vs CPU"; its
toleranceOverride decorators are attached to specific PyTorch tests. We use
the ones an op declares for TestCommon.test_compare_cpu (the PyTorch test
that does what this file does) for the dtype, if any, else
torch.testing.assert_close's dtype-based defaults. Since max_device runs the
CPU kernel on the same bytes, most results are bit-identical anyway.

Declared gaps are in KNOWN_FAILURES, applied as strict xfail: a case that
starts passing fails the run until its entry is removed.
"""

import pytest
import torch

import max_device  # noqa: F401  (registers the device)
from max_device.testing import opinfo_tolerance, sample_to_device, to_cpu
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import (BinaryUfuncInfo, ReductionOpInfo, ShapeFuncInfo,
                                                 UnaryUfuncInfo)

DEVICE = "max_device"
DTYPES = (torch.float32, torch.int64)
MAX_SAMPLES = 4

# View and shape-manipulation ops beyond ShapeFuncInfo (which holds only
# repeat and tile); names not in op_db are ignored.
VIEW_AND_SHAPE_OPS = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "squeeze",
    "unsqueeze", "permute", "transpose", "t", "T", "mT", "H", "mH", "movedim", "moveaxis", "swapaxes",
    "swapdims", "narrow", "narrow_copy", "select", "expand", "expand_as", "broadcast_to",
    "as_strided", "unfold", "diagonal", "split", "split_with_sizes", "tensor_split", "chunk",
    "unbind", "flip", "fliplr", "flipud", "roll", "rot90", "cat", "stack", "hstack", "vstack",
    "dstack", "contiguous", "atleast_1d", "atleast_2d", "atleast_3d", "hsplit", "vsplit", "dsplit",
    "column_stack", "row_stack", "view_as_real", "resolve_conj", "resolve_neg", "alias_copy",
    "squeeze_copy", "unsqueeze_copy", "permute_copy", "transpose_copy", "t_copy", "expand_copy",
    "view_copy", "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    "index_select", "take_along_dim", "gather", "masked_select", "triu", "tril", "repeat_interleave",
}

_OPINFO_CLASSES = (UnaryUfuncInfo, BinaryUfuncInfo, ReductionOpInfo, ShapeFuncInfo)

# OpInfos in the selection that claim CPU dtypes but cannot run on the CPU at
# all (CUDA-only jiterator): not generated, like any op without CPU support.
CPU_UNSUPPORTED = {"jiterator_unary", "jiterator_binary", "jiterator_binary_return_by_ref",
                   "jiterator_4inputs_with_extra_args"}

# op id ("name" or "name.variant") -> reason; applies to every dtype of the op,
# or (op id, dtype name) -> reason for one dtype, or (op id, "error_inputs").
KNOWN_FAILURES = {
    "chalf": "by design: max_device refuses complex32 (ComplexHalf) tensors (ops.cpp check_options)",
    ("narrow_copy", "error_inputs"): (
        "PyTorch divergence, not a loader bug: narrow_copy's CompositeExplicitAutogradNonFunctional "
        "kernel (narrow + clone, what CUDA runs too) wins over the fallback and raises IndexError for "
        "a bad dim; CPU's narrow_copy_dense_cpu raises RuntimeError"),
}


def _selected_ops():
    chosen = [op for op in op_db
              if (isinstance(op, _OPINFO_CLASSES) or op.name in VIEW_AND_SHAPE_OPS)
              and op.name not in CPU_UNSUPPORTED]
    return sorted(chosen, key=lambda op: (op.name, op.variant_test_name))


def _op_id(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _known_failure(op, dtype=None):
    reason = KNOWN_FAILURES.get((_op_id(op), _dtype_name(dtype))) if dtype is not None else None
    return reason or KNOWN_FAILURES.get(_op_id(op))


def _cases():
    for op in _selected_ops():
        cpu_dtypes = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in cpu_dtypes:
                continue
            marks = []
            reason = _known_failure(op, dtype)
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            yield pytest.param(op, dtype, id=f"{_op_id(op)}-{_dtype_name(dtype)}", marks=marks)


def _error_cases():
    for op in _selected_ops():
        if op.error_inputs_func is None:
            continue
        marks = []
        reason = KNOWN_FAILURES.get((_op_id(op), "error_inputs"))
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        yield pytest.param(op, id=_op_id(op), marks=marks)


def _storage_ptrs(value):
    if isinstance(value, torch.Tensor):
        return {value.untyped_storage().data_ptr()}
    if isinstance(value, (list, tuple)):
        return set().union(*(_storage_ptrs(v) for v in value)) if value else set()
    return set()


def _check_views(cpu_out, dev_out, cpu_in, dev_in):
    """A CPU output that is a view of an input must be a view of the device
    input too (same storage)."""
    if isinstance(cpu_out, torch.Tensor):
        if cpu_out._is_view() and cpu_out.untyped_storage().data_ptr() in _storage_ptrs(cpu_in) \
                and cpu_out.untyped_storage().nbytes() > 0:
            assert dev_out.untyped_storage().data_ptr() in _storage_ptrs(dev_in), \
                "CPU returns a view of the input; max_device returned a copy"
    elif isinstance(cpu_out, (list, tuple)):
        for c, d in zip(cpu_out, dev_out):
            _check_views(c, d, cpu_in, dev_in)


@pytest.mark.parametrize("op, dtype", list(_cases()))
def test_opinfo_matches_cpu(op, dtype):
    kwargs_tol = opinfo_tolerance(op, dtype)
    ran = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if ran == MAX_SAMPLES:
            break
        ran += 1
        dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
        expected = op(sample.input, *sample.args, **sample.kwargs)
        actual = op(dev_input, *dev_args, **dev_kwargs)
        torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True, **kwargs_tol,
                                   msg=lambda m: f"{_op_id(op)} {dtype} sample {ran - 1} "
                                                 f"({sample.summary() if hasattr(sample, 'summary') else ''}): {m}")
        _check_views(expected, actual, (sample.input, sample.args), (dev_input, dev_args))
    assert ran > 0, "OpInfo gave no samples"


@pytest.mark.parametrize("op", list(_error_cases()))
def test_opinfo_error_inputs(op):
    checked = 0
    for error_input in op.error_inputs("cpu"):
        sample = error_input.sample_input
        cpu_error = None
        try:
            op(sample.input, *sample.args, **sample.kwargs)
        except Exception as e:  # noqa: BLE001  (any type; compared below)
            cpu_error = e
        if cpu_error is None:
            continue  # not an error on this build's CPU: nothing to compare
        dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
        with pytest.raises(Exception) as info:
            op(dev_input, *dev_args, **dev_kwargs)
        assert type(info.value) is type(cpu_error), (
            f"CPU raised {type(cpu_error).__name__}({cpu_error}); "
            f"max_device raised {type(info.value).__name__}({info.value})")
        checked += 1
    if checked == 0:
        pytest.skip("no error input raises on the CPU")  # reported, not silent
