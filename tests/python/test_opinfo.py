"""PyTorch's device-generic OpInfo tests, run on max_device.

The test classes are instantiated by PyTorch's own machinery
(``instantiate_device_type_tests(..., only_for="privateuse1")``: max_device
is the renamed PrivateUse1 backend), parametrized by ``@ops`` over
``op_db``, so tests are named like PyTorch's:
``TestOpInfoFallbackMAX_DEVICE::test_compare_cpu_add_max_device_float32``.
(only_for does here what PYTORCH_TESTING_DEVICE_FOR_CUSTOM=privateuse1 does
for PyTorch's own test files, without the CPU classes.)

Three configurations, one class each: ``Fallback`` (no plugin: every op runs
the zero-copy CPU fallback), ``Reference`` (build/plugins/libreference.so
loaded for the duration of each test; loading and unloading costs ~5 ms)
and ``Fast`` (build/plugins/libfast.so the same way, float32 and bfloat16
only: the dtypes it serves).

The checks, in the spirit of PyTorch's test_ops.TestCommon, compare
max_device with the CPU on the same samples (built on the CPU and copied
with their memory layout): plain samples (plus "an output that is a view of
an input on the CPU is one on max_device too"), non-contiguous copies of
them, ``out=`` variants (correctly sized and empty out tensors), in-place
variants, and error_inputs (the same exception type). Where the CPU raises
on a sample, max_device must raise the same type.

Selection, from ``MAXDEV_OPINFO``:
- ``ci`` (default): Fallback over the whole op_db with one dtype per op
  (float32 where supported); Reference and Fast over the OpInfos that reach
  an op their plugin serves, every dtype they support (Fast: of float32 and
  bfloat16); the first SAMPLES_PER_CASE samples of each case.
- ``full``: every configuration over the whole op_db, every supported dtype,
  every sample.
``MAXDEV_OPINFO_SHARD=i/n`` keeps the ops whose op_db index is i modulo n
(to split a run across jobs).

Declared gaps are in KNOWN_FAILURES, applied as strict xfail: a case that
starts passing fails the run until its entry is removed; KNOWN_SKIPS holds
the cases whose outcome is not max_device's to judge. (No case crashes the
process: a full run's crash survey found copies of conjugated tensors
recursing until the stack overflowed, since fixed.)
"""

import copy
import itertools
import os

import pytest
import torch

import max_device
from conftest import build_paths
from max_device.testing import opinfo_tolerance, opinfos_for, sample_to_device, to_cpu
# After max_device: common_device_type lists PrivateUse1 as a device type
# only if the backend is registered when it is imported.
from torch.testing._internal.common_device_type import (OpDTypes, PrivateUse1TestBase,
                                                        instantiate_device_type_tests, ops)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase
from torch.testing._internal.opinfo.core import DecorateInfo

MODE = os.environ.get("MAXDEV_OPINFO", "ci")
if MODE not in ("ci", "full"):
    raise ValueError(f"MAXDEV_OPINFO={MODE!r}: expected 'ci' or 'full'")

# In ci mode: the first samples of each case only (some OpInfos have hundreds).
SAMPLES_PER_CASE = 8

# Random ops draw from the CPU default generator on both devices (see
# README): the same seed before each run gives the same numbers.
SEED = 1234



# OpInfo.has_nondeterministic_output (torch 2.13) for the torch versions
# whose OpInfos lack it: the OpInfos that set it in 2.13.
NONDETERMINISTIC_OUTPUT = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                           "new_empty_strided", "torch.ops.aten._efficient_attention_forward",
                           "torch.ops.aten._flash_attention_forward"}


def _nondeterministic_output(op):
    return getattr(op, "has_nondeterministic_output", op.full_name in NONDETERMINISTIC_OUTPUT)


# (test name or None for every test, OpInfo full name, dtype or None for
# every dtype, configuration or None for all) -> why it fails. Test names are
# the generic ones (test_compare_cpu, ...); configurations "Fallback",
# "Reference" and "Fast". Applied as strict xfail.
KNOWN_FAILURES = {
    (None, "chalf", None, None):
        "by design: max_device refuses complex32 (ComplexHalf) tensors (ops.cpp check_options)",
    **{(None, op, None, None): "by design: max_device has no sparse layouts"
       for op in ("sparse.sampled_addmm", "to_sparse")},
    **{(test, "to", None, None): (
        "harness: samples such as x.to('cpu', torch.float64) name the CPU positionally, so the "
        "result is on the CPU as asked and is not moved to max_device")
       for test in ("test_compare_cpu", "test_noncontiguous_samples")},
    ("test_errors", "gradient", None, None):
        "harness: an error input holds a meta tensor, which cannot be copied to max_device",
    ("test_out", "mode", None, None): (
        "PyTorch divergence: mode's out= variant refuses every device but CPU, CUDA and XPU "
        "before dispatch"),
    **{(test, "complex", torch.float16, None): (
        "by design: complex() of two float16 tensors returns a complex32 (ComplexHalf) tensor, "
        "which max_device refuses (ops.cpp check_options)")
       for test in ("test_compare_cpu", "test_noncontiguous_samples", "test_out")},
    **{(test, f"nn.functional.linear_cross_entropy.{variant}", dtype, config): (
        "PyTorch divergence: linear_cross_entropy's 'auto' options are chosen per device type: "
        "_AUTO_DEFAULTS gives the CPU 'accurate' and any other device 'compact', and "
        "_resolve_auto_acc_dtype accumulates in float32 on 'cpu' and 'cuda' only (a hard-coded "
        "check, so a table entry for max_device cannot match it): the devices run different "
        "algorithms in float16/bfloat16")
       for test in ("test_compare_cpu", "test_noncontiguous_samples")
       for variant, dtype, config in (
           ("chunked", torch.float16, "Fallback"), ("chunked", torch.float16, "Reference"),
           ("chunked_none", torch.float16, "Fallback"), ("chunked_none", torch.float16, "Reference"),
           ("chunked_none", torch.bfloat16, "Fallback"), ("chunked_none", torch.bfloat16, "Reference"),
           ("chunked_none", torch.bfloat16, "Fast"))},
    **{("test_noncontiguous_samples", "cov", dtype, "Reference"): (
        "by design (as multi_head_attention_forward): cov's normalizer is w.sum() of the float32 "
        "product fweights * aweights; the reference plugin's sum accumulates in double and rounds "
        "once, the CPU's adds in float, so the float32 sums differ by an ulp (seen: 9.5e-7 on "
        "~15) and that 6e-8 relative difference divides the float64 result; the other ops of the "
        "dispatch trace are bit-identical. The harness reseeds before every run, so the samples, and sample 31's hit, are the same each run")
       for dtype in (torch.float64, torch.complex128)},
    **{(test, "nn.functional.multi_head_attention_forward", torch.float32, "Reference"): (
        "by design: the reference plugin's matmuls sum in double; on every failing sample its result "
        "is closer to the float64 computation than the CPU's (MKL, float accumulation), so OpInfo's "
        "float32 tolerance against the CPU is the wrong yardstick")
       for test in ("test_compare_cpu", "test_noncontiguous_samples")},
    ("test_out", "linalg.multi_dot", torch.float32, "Reference"): (
        "by design (as multi_head_attention_forward): the reference plugin's mm sums in double, "
        "another order than MKL; the out= chain exceeds OpInfo's float32 tolerance (not checked "
        "against the float64 result; the plain and non-contiguous cases pass)"),
}

# max_device refuses complex32 tensors by design (test_dtypes.py checks the
# refusal): no case is generated for it.
GENERATED_DTYPES = set().union(*(op.supported_dtypes("cpu") for op in op_db)) - {torch.complex32}

# Same keys: cases whose outcome is not max_device's to judge, skipped with
# the reason (a strict xfail cannot hold a case that passes by chance).
KNOWN_SKIPS = {
    **{("test_out", op, None, None): (
        "PyTorch bug: with an int dim (sample dim=0) and out=, the CPU's ihfft2/ihfftn leave out "
        "unwritten (a NaN-filled out stays NaN), so both devices return leftover memory")
       for op in ("fft.ihfft2", "fft.ihfftn")},
}


def _op_shard(selected):
    shard = os.environ.get("MAXDEV_OPINFO_SHARD")
    if not shard:
        return selected
    index, count = (int(n) for n in shard.split("/"))
    return [op for op in selected if op_db.index(op) % count == index]


# configuration -> the plugin file its tests load (in <build>/plugins/)
PLUGIN_FILES = {"Reference": "libreference.so", "Fast": "libfast.so"}


def _plugin_path(config):
    paths = build_paths()
    return os.path.join(paths["plugins"], PLUGIN_FILES[config]) if paths else None


def _plugin_opinfos(config):
    """The OpInfos whose samples reach an op the configuration's plugin
    serves, from its manifest (read without loading it); all of op_db when
    the plugin is not built (every test then skips)."""
    path = _plugin_path(config)
    if path is None or not os.path.isfile(path):
        return list(op_db)
    served = {id(info) for entry in max_device.inspect(path).kernels for info in opinfos_for(entry.op)}
    return [op for op in op_db if id(op) in served]


def _with_known_cases(selected, config):
    """Copies of the `selected` OpInfos carrying KNOWN_FAILURES (strict xfail)
    and KNOWN_SKIPS of this configuration as DecorateInfos. (PyTorch 2.13's
    PrivateUse1TestBase.set_test_configs(op_overrides=...) does the same;
    2.12 has no such hook, and OpInfo decorators work in every version.)"""
    overrides = {}
    for table, mark in ((KNOWN_FAILURES, lambda reason: pytest.mark.xfail(strict=True, reason=reason)),
                        (KNOWN_SKIPS, lambda reason: pytest.mark.skip(reason=reason))):
        for (test, op_name, dtype, only_config), reason in table.items():
            if only_config in (None, config):
                overrides.setdefault(op_name, []).append(DecorateInfo(
                    mark(reason), test_name=test, dtypes=None if dtype is None else (dtype,)))
    decorated = []
    for op in selected:
        if op.full_name in overrides:
            op = copy.copy(op)
            op.decorators = tuple(op.decorators) + tuple(overrides[op.full_name])
        decorated.append(op)
    return decorated


def _samples(op, dtype):
    """The op's samples on the CPU; in ci mode only the first SAMPLES_PER_CASE."""
    samples = op.sample_inputs("cpu", dtype)
    return samples if MODE == "full" else itertools.islice(samples, SAMPLES_PER_CASE)


def _names_device(value):
    """Whether value holds a max_device tensor or a device="max_device"."""
    if isinstance(value, torch.Tensor):
        return value.device.type == "max_device"
    if isinstance(value, (list, tuple)):
        return any(_names_device(v) for v in value)
    if isinstance(value, dict):
        return any(_names_device(v) for v in value.values())
    return (isinstance(value, str) and value == "max_device") or \
        (isinstance(value, torch.device) and value.type == "max_device")


def _outcome(run):
    """(result, None) or (None, the exception), after seeding."""
    torch.manual_seed(SEED)
    try:
        return run(), None
    except Exception as e:  # noqa: BLE001  (any type; compared with the CPU's)
        return None, e


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
        if cpu_out._is_view() and cpu_out.untyped_storage().nbytes() > 0 \
                and cpu_out.untyped_storage().data_ptr() in _storage_ptrs(cpu_in):
            assert dev_out.untyped_storage().data_ptr() in _storage_ptrs(dev_in), \
                "CPU returns a view of the input; max_device returned a copy"
    elif isinstance(cpu_out, (list, tuple)):
        for c, d in zip(cpu_out, dev_out):
            _check_views(c, d, cpu_in, dev_in)


def _layout(value):
    """(shape, dtype, strides) of each tensor in value."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.stride())
    if isinstance(value, (list, tuple)):
        return [_layout(v) for v in value]
    return value


def _tensors(value):
    """value as a tuple of tensors, or None if any part is not a tensor."""
    parts = value if isinstance(value, (list, tuple)) else (value,)
    return tuple(parts) if parts and all(isinstance(p, torch.Tensor) for p in parts) else None


class OpInfoChecks(TestCase):
    """The checks; _instantiate turns them into one test class per
    configuration. config: with a plugin in PLUGIN_FILES, load it around
    each test."""

    config = "Fallback"

    def setUp(self):
        super().setUp()
        self.loaded = None
        if self.config in PLUGIN_FILES:
            path = _plugin_path(self.config)
            if path is None:
                self.skipTest("no build (run `make build`, or set MAXDEV_BUILD_DIR)")
            self.loaded = max_device.load_plugin(path)

    def tearDown(self):
        if self.loaded is not None:
            max_device.unload_plugin(self.loaded)
        super().tearDown()

    def _same_outcome(self, run_cpu, run_device, where):
        """Runs both; the results if neither raised, else None after checking
        that both raised the same exception type."""
        expected, cpu_error = _outcome(run_cpu)
        actual, device_error = _outcome(run_device)
        if cpu_error is None and device_error is None:
            return expected, actual
        self.assertIs(type(device_error), type(cpu_error),
                      f"{where}: CPU raised {type(cpu_error).__name__}({cpu_error}); max_device "
                      f"raised {type(device_error).__name__}({device_error})")
        return None

    def _assert_close(self, actual, expected, op, dtype, where):
        if _nondeterministic_output(op):  # empty*, uninitialized memory: compare the layout only
            self.assertEqual(_layout(actual), _layout(expected), f"{where}: layouts differ")
            return
        torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True,
                                   **opinfo_tolerance(op, dtype), msg=lambda m: f"{where}: {m}")

    def _compare_samples(self, op, dtype, samples):
        ran = 0
        for index, sample in enumerate(samples):
            where = f"sample {index} ({sample.summary()})"
            dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
            if not _names_device((dev_input, dev_args, dev_kwargs)):
                continue  # e.g. arange(2): computes on the CPU wherever it runs
            outcome = self._same_outcome(lambda: op(sample.input, *sample.args, **sample.kwargs),
                                         lambda: op(dev_input, *dev_args, **dev_kwargs), where)
            ran += 1
            if outcome is None:
                continue
            expected, actual = outcome
            self._assert_close(actual, expected, op, dtype, where)
            _check_views(expected, actual, (sample.input, sample.args), (dev_input, dev_args))
        if ran == 0:
            self.skipTest("no sample runs on max_device")  # e.g. broadcast_shapes: shapes only

    def check_compare_cpu(self, dtype, op):
        self._compare_samples(op, dtype, _samples(op, dtype))

    def check_noncontiguous_samples(self, dtype, op):
        # to_device keeps strides: the device sample is as non-contiguous.
        self._compare_samples(op, dtype, (s.noncontiguous() for s in _samples(op, dtype)))

    def check_out(self, dtype, op):
        checked = 0
        for index, sample in enumerate(_samples(op, dtype)):
            expected, error = _outcome(lambda: op(sample.input, *sample.args, **sample.kwargs))
            outs = None if error else _tensors(expected)
            if outs is None:
                continue  # no tensor outputs to write into
            for make_out in (torch.empty_like, lambda t: t.new_empty(0)):
                where = f"sample {index} ({sample.summary()}), out={make_out(outs[0]).shape}"
                cpu_out = tuple(make_out(t) for t in outs)
                dev_out = tuple(make_out(t).to("max_device") for t in outs)
                out_arg = (lambda o: o if isinstance(expected, (list, tuple)) else o[0])
                dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
                outcome = self._same_outcome(
                    lambda: op(sample.input, *sample.args, **sample.kwargs, out=out_arg(cpu_out)),
                    lambda: op(dev_input, *dev_args, **dev_kwargs, out=out_arg(dev_out)), where)
                checked += 1
                if outcome is None:
                    continue
                self._assert_close(dev_out, cpu_out, op, dtype, where)
                if _tensors(outcome[0]) is not None:  # some ops return None with out=
                    self.assertEqual([t.data_ptr() for t in _tensors(outcome[1])],
                                     [t.data_ptr() for t in dev_out],
                                     f"{where}: the result is not the out= tensor")
        if checked == 0:
            self.skipTest("no sample has tensor outputs")

    def check_inplace(self, dtype, op):
        for index, sample in enumerate(_samples(op, dtype)):
            if not isinstance(sample.input, torch.Tensor):
                continue
            where = f"sample {index} ({sample.summary()})"
            dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
            outcome = self._same_outcome(
                lambda: op.inplace_variant(sample.input, *sample.args, **sample.kwargs),
                lambda: op.inplace_variant(dev_input, *dev_args, **dev_kwargs), where)
            if outcome is None:
                continue
            self._assert_close(dev_input, sample.input, op, dtype, f"{where}, the modified input")
            self.assertEqual(outcome[1].data_ptr(), dev_input.data_ptr(),
                             f"{where}: the result is not the input")

    def check_errors(self, op):
        checked = 0
        for index, error_input in enumerate(op.error_inputs("cpu")):
            sample = error_input.sample_input
            dev_input, dev_args, dev_kwargs = sample_to_device(op, sample)
            self._same_outcome(lambda: op(sample.input, *sample.args, **sample.kwargs),
                               lambda: op(dev_input, *dev_args, **dev_kwargs),
                               f"error input {index} ({error_input.error_regex!r})")
            checked += 1
        if checked == 0:
            self.skipTest("no error inputs")


def _instantiate(config, selected, dtypes, allowed_dtypes=GENERATED_DTYPES):
    """TestOpInfo<config>MAX_DEVICE: the checks over `selected` OpInfos, by
    PyTorch's device-generic machinery, with the known failures and crashes marked."""
    generic_name = f"TestOpInfo{config}"
    selected = _with_known_cases(_op_shard(selected), config)
    with_errors = [op for op in selected if op.error_inputs_func is not None]
    # (ops() fails on an OpInfo with no dtype at all when dtypes is a filter.)
    selected = [op for op in selected if op.supported_dtypes("cpu")]

    # Defined per call: ops() and instantiation attach state to the test
    # functions, so each class needs its own.
    config_name = config
    class Generic(OpInfoChecks):
        config = config_name

        @ops(selected, dtypes=dtypes, allowed_dtypes=allowed_dtypes)
        def test_compare_cpu(self, dtype, op):
            self.check_compare_cpu(dtype, op)

        @ops(selected, dtypes=dtypes, allowed_dtypes=allowed_dtypes)
        def test_noncontiguous_samples(self, dtype, op):
            self.check_noncontiguous_samples(dtype, op)

        @ops([op for op in selected if op.supports_out], dtypes=dtypes, allowed_dtypes=allowed_dtypes)
        def test_out(self, dtype, op):
            self.check_out(dtype, op)

        @ops([op for op in selected if op.inplace_variant is not None], dtypes=dtypes,
             allowed_dtypes=allowed_dtypes)
        def test_inplace(self, dtype, op):
            self.check_inplace(dtype, op)

        @ops(with_errors, dtypes=OpDTypes.none)
        def test_errors(self, op):
            self.check_errors(op)

    Generic.__name__ = Generic.__qualname__ = generic_name
    scope = {generic_name: Generic}
    instantiate_device_type_tests(Generic, scope, only_for="privateuse1")
    return scope[generic_name + "MAX_DEVICE"]


# Renames PrivateUse1TestBase's device type to "max_device" now rather than
# halfway through instantiating the first class (its first op would be
# matched against DecorateInfos under the old name).
PrivateUse1TestBase.setUpClass()

TestOpInfoFallbackMAX_DEVICE = _instantiate(
    "Fallback", op_db, OpDTypes.supported if MODE == "full" else OpDTypes.any_one)
TestOpInfoReferenceMAX_DEVICE = _instantiate(
    "Reference", op_db if MODE == "full" else _plugin_opinfos("Reference"), OpDTypes.supported)
TestOpInfoFastMAX_DEVICE = _instantiate(
    "Fast", op_db if MODE == "full" else _plugin_opinfos("Fast"), OpDTypes.supported,
    allowed_dtypes={torch.float32, torch.bfloat16})
