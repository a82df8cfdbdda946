"""Checking kernels against PyTorch's own OpInfo samples.

PyTorch's OpInfo database (``op_db``, in the wheel) holds sample inputs and
tolerances for every op it tests. ``check_plugin`` runs them for every op a
plugin serves, on max_device against the CPU: plain, non-contiguous,
in-place and ``out=`` variants, and the ``error_inputs`` that must raise.
Ops without an OpInfo (custom ops) are checked with
``torch.library.opcheck`` and an author's reference function on the author's
samples. Beyond OpInfo's samples every op is also checked the ways new
kernels most often go wrong: ``out=`` tensors that are empty, of the wrong
size or overlapping an input (PyTorch resizes or raises; the kernel must
agree), extremal inputs (large magnitudes, empty and 0-dim tensors,
transposed, expanded and offset layouts, broadcasting either way) and the
gradients through the op's autograd formula. Reload validation
(``validate=True``), the isolated check and ``python -m max_device check``
all run this one engine.
"""

import dataclasses
import functools
import math
import sys
import time
import warnings
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .coverage import CoverageReport, core_op_coverage  # noqa: F401  (public through max_device.testing)

DEVICE = "max_device"


def to_device(value, storages: Optional[dict] = None):
    """Copy a sample to max_device, keeping its memory layout: tensors that
    share a CPU storage share one device storage, with the same storage
    offset and strides (as_strided samples index into the whole storage,
    and error_inputs test out= tensors that overlap their inputs), and one
    tensor passed twice is one device tensor (cat(out=) of an empty input:
    empty storages have no address to share)."""
    storages = {} if storages is None else storages
    if isinstance(value, torch.Tensor):
        same = storages.get(("tensor", id(value)))
        if same is not None:
            return same[1]
        t = value.detach()
        cpu_storage = t.untyped_storage()
        key = cpu_storage.data_ptr()
        dev_storage = storages.get(key) if cpu_storage.nbytes() else None
        if dev_storage is None:
            dev_storage = cpu_storage.max_device()
            if cpu_storage.nbytes():
                storages[key] = dev_storage
        moved = torch.empty(0, dtype=t.dtype, device=DEVICE).set_(
            dev_storage, t.storage_offset(), t.size(), t.stride())
        # the storage holds the unconjugated, unnegated values: keep the views' bits
        moved = moved.conj() if t.is_conj() else moved
        moved = moved._neg_view() if t.is_neg() else moved
        storages[("tensor", id(value))] = (value, moved)  # holding value keeps its id unique
        return moved
    if isinstance(value, (list, tuple)):
        moved = [to_device(v, storages) for v in value]
        return moved if isinstance(value, list) else tuple(moved)
    if isinstance(value, dict):
        return {k: to_device(v, storages) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device(DEVICE)
    return value


def to_cpu(value):
    """Copy results back to the CPU; every tensor must be on max_device."""
    if isinstance(value, torch.Tensor):
        assert value.device.type == DEVICE, f"output on {value.device}, expected max_device"
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value) if not hasattr(value, "_fields") \
            else type(value)(*(to_cpu(v) for v in value))
    return value


# Arguments PyTorch requires on the CPU whatever the input's device (OpInfo
# name -> positions in sample.args): they stay on the CPU.
ARGS_KEPT_ON_CPU = {"tensor_split": {0}}


def sample_to_device(opinfo, sample):
    """(input, args, kwargs) of an OpInfo sample on max_device, sharing
    storages as on the CPU; arguments PyTorch wants on the CPU stay there."""
    dev_input, dev_args, dev_kwargs = to_device((sample.input, sample.args, sample.kwargs))
    if dev_kwargs.get("device") == "cpu":  # to_device moves torch.device objects, not strings
        dev_kwargs["device"] = DEVICE
    keep = ARGS_KEPT_ON_CPU.get(opinfo.name, ())
    dev_args = tuple(sample.args[i] if i in keep else a for i, a in enumerate(dev_args))
    return dev_input, dev_args, dev_kwargs


def opinfo_tolerance(opinfo, dtype) -> dict:
    """``{"atol": ..., "rtol": ...}`` from a toleranceOverride the OpInfo
    declares for TestCommon.test_compare_cpu (PyTorch's own "device vs CPU"
    test) for ``dtype``, else ``{}`` (assert_close's dtype defaults)."""
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo
    for info in opinfo.decorators:
        if not isinstance(info, DecorateInfo) or info.test_name not in (None, "test_compare_cpu"):
            continue
        if info.cls_name not in (None, "TestCommon"):
            continue
        if info.device_type not in (None, "cpu", DEVICE, "privateuse1") or \
                (info.dtypes and dtype not in info.dtypes):
            continue
        for deco in info.decorators:
            if isinstance(deco, toleranceOverride) and dtype in deco.d:
                return {"atol": deco.d[dtype].atol, "rtol": deco.d[dtype].rtol}
    return {}


@functools.lru_cache(maxsize=None)
def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return tuple(op_db)


def _base_name(op: str) -> str:
    """'aten::_softmax.out' -> 'softmax'; 'aten::relu_' -> 'relu'."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    return name.strip("_")


def opinfos_for(op: str) -> List:
    """The OpInfos whose samples reach ``op`` (an aten op name with or
    without overload): matched on the OpInfo's aten name and its last name
    component. Ops outside ``aten`` have none (a custom ``myplug::rms_norm``
    is not PyTorch's ``rms_norm``)."""
    if not op.startswith("aten::"):
        return []
    base = _base_name(op)
    return [info for info in _op_db()
            if base in {(info.aten_name or "").strip("_"), info.name.split(".")[-1].strip("_")}]



# --- Results -----------------------------------------------------------------

PASSED, FAILED, DECLINED, NOT_COVERED = "passed", "failed", "declined", "not covered"

# A sample given by a plugin author: positional and keyword arguments, on the CPU.
Case = Tuple[tuple, dict]


@dataclasses.dataclass
class SampleFailure:
    """One sample on which max_device disagreed with the CPU (or the
    reference), or raised where it should not, or did not raise where
    PyTorch says it must."""

    op: str             # the op checked
    source: str         # the OpInfo ("name" or "name.variant"), or "samples" (the author's)
    dtype: str
    variant: str        # function, noncontiguous, out, inplace, error_input, reference, opcheck,
                        # out_empty, out_wrong_size, out_overlap, extremal_<kind>, autograd
    sample: int         # index of the sample in its source
    description: str    # the sample's shapes and non-tensor arguments
    max_abs: float      # largest absolute difference (nan: not comparable)
    max_rel: float
    error: str          # assert_close's message, or the exception

    def __str__(self) -> str:
        numbers = "" if math.isnan(self.max_abs) else \
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}: "
        lines = [line for line in self.error.splitlines() if line.strip()]
        return (f"{self.op} [{self.source} {self.variant}, {self.dtype}, sample {self.sample}: "
                f"{self.description}]: {numbers}{' '.join(lines[:2])}")


@dataclasses.dataclass
class OpResult:
    """The verdict for one (op, dtype). ``samples`` counts the sample runs
    that reached the plugin's kernel (only those are judged); ``declined``
    the runs its kernel declined or that fell to the CPU fallback."""

    op: str
    dtype: str
    status: str = NOT_COVERED    # passed, failed, declined, not covered
    samples: int = 0
    declined: int = 0
    failures: List[SampleFailure] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def worst(self) -> Optional[SampleFailure]:
        """The failure with the largest error; exceptions (no numbers) first."""
        return max(self.failures, key=lambda f: math.inf if math.isnan(f.max_abs) else f.max_abs,
                   default=None)

    def finish(self) -> "OpResult":
        self.status = FAILED if self.failures else PASSED if self.samples else \
            DECLINED if self.declined else NOT_COVERED
        return self


@dataclasses.dataclass
class CheckResult:
    """What ``check_plugin`` found: one ``OpResult`` per (op, dtype)."""

    plugin: str
    file: str
    results: List[OpResult]
    seconds: float
    kernels: List[dict] = dataclasses.field(default_factory=list)  # op, dtypes, flags (manifest)

    @property
    def passed(self) -> bool:
        return not any(r.status == FAILED for r in self.results)

    @property
    def uncovered(self) -> List[str]:
        """Ops no sample reached at any dtype (custom ops without samples=)."""
        ops = dict.fromkeys(r.op for r in self.results)
        return [op for op in ops if all(r.status == NOT_COVERED for r in self.results if r.op == op)]

    @property
    def failures(self) -> List[SampleFailure]:
        return [f for r in self.results for f in r.failures]

    def table(self) -> str:
        rows = [("op", "dtype", "status", "samples", "declined", "worst sample / note")]
        for r in self.results:
            rows.append((r.op, r.dtype, r.status, str(r.samples), str(r.declined),
                         str(r.worst) if r.worst else r.note))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        return "\n".join("  ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]).rstrip()
                         for row in rows)

    def summary(self) -> str:
        counts = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        tally = ", ".join(f"{n} {status}" for status, n in counts.items())
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.failures)} failing samples)"
        return (f"plugin '{self.plugin}' ({self.file}): {verdict}: {len(self.results)} (op, dtype) "
                f"checks: {tally}; {self.seconds:.1f} s")

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    def to_json(self) -> dict:
        """A JSON-serializable dict (numbers that are not comparable are null)."""
        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value
        results = [dict(dataclasses.asdict(r), worst=dataclasses.asdict(r.worst) if r.worst else None)
                   for r in self.results]
        return clean({"plugin": self.plugin, "file": self.file, "passed": self.passed,
                      "uncovered": self.uncovered, "seconds": self.seconds, "kernels": self.kernels,
                      "results": results})


# --- Running one sample ------------------------------------------------------

_SKIP = object()  # nothing to judge: the CPU refuses the sample (accepts it, for an error input)


def _describe(args: tuple, kwargs: dict) -> str:
    def show(v):
        if isinstance(v, torch.Tensor):
            return f"{tuple(v.shape)}" + ("" if v.is_contiguous() else " non-contiguous")
        if isinstance(v, (list, tuple)) and v and all(isinstance(t, torch.Tensor) for t in v):
            return "[" + ", ".join(show(t) for t in v) + "]"
        return repr(v)
    return ", ".join([show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()])


def _errors(expected, actual):
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor) \
            and expected.shape == actual.shape and expected.is_floating_point():
        diff = (expected.double() - actual.double()).abs()
        if diff.numel() == 0:
            return 0.0, 0.0
        rel = diff / expected.double().abs().clamp_min(1e-12)
        return float(diff.nan_to_num(math.inf).max()), float(rel.nan_to_num(math.inf).max())
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)) and expected:
        pairs = [_errors(e, a) for e, a in zip(expected, actual)]
        return max(p[0] for p in pairs), max(p[1] for p in pairs)
    return math.nan, math.nan


def _compare(run, reference, cpu_case: Case, device_case: Case, tolerance: dict):
    """None when ``run`` on max_device matches ``reference`` on the CPU,
    (max_abs, max_rel, error) when it does not, _SKIP when the CPU raises."""
    try:
        expected = reference(*cpu_case[0], **cpu_case[1])
    except Exception:  # noqa: BLE001 - an input the op refuses: nothing to compare
        return _SKIP
    actual = None
    try:
        actual = to_cpu(run(*device_case[0], **device_case[1]))
        torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)
    except Exception as e:  # noqa: BLE001 - any failure is a finding
        return (*_errors(expected, actual), f"{type(e).__name__}: {e}")
    return None


def _expect_error(run, cpu_case: Case, device_case: Case):
    """An error input: max_device must raise what the CPU raises (or a subclass)."""
    try:
        run(*cpu_case[0], **cpu_case[1])
    except Exception as e:  # noqa: BLE001 - the type is compared below
        expected = type(e)
    else:
        return _SKIP  # not an error on this build's CPU
    try:
        run(*device_case[0], **device_case[1])
    except Exception as e:  # noqa: BLE001
        if isinstance(e, expected):
            return None
        return math.nan, math.nan, f"raised {type(e).__name__} ({e}) where the CPU raises {expected.__name__}"
    return math.nan, math.nan, f"raised nothing where the CPU raises {expected.__name__}"


def _opcheck(overload, tests: Optional[Sequence[str]]):
    """torch.library.opcheck as a comparison: the failing tests, joined."""
    def attempt(_cpu_case, device_case):
        options = {} if tests is None else {"test_utils": tuple(tests)}
        results = torch.library.opcheck(overload, tuple(device_case[0]), dict(device_case[1]),
                                        raise_exception=False, **options)
        failed = [f"{test}: {type(r).__name__}: {r}" for test, r in results.items() if r != "SUCCESS"]
        return (math.nan, math.nan, "; ".join(failed)) if failed else None
    return attempt


def _kernel_counts(owner: Optional[str], op: str) -> Tuple[int, int]:
    """(calls the plugin ``owner``'s kernel for ``op`` ran, calls of ``op``
    declined or sent to the CPU fallback), from the loader's counters."""
    from . import _C
    for entry in _C._list_ops():
        if entry["op"] == op:
            calls = sum(l["calls"] for l in entry["layers"] if l["owner"].split("@", 1)[0] == owner)
            return calls, sum(l["declines"] for l in entry["layers"]) + entry["fallbacks"]
    return 0, 0


class _Tally:
    """Runs the samples of one (op, dtype) and judges those that reached
    the plugin's kernel. Without an owner every run is judged: reload
    validation runs while the registry is busy publishing (its counters
    cannot be read) and the staged version is not listed anyway."""

    def __init__(self, op: str, dtype: str, owner: Optional[str]):
        self.result = OpResult(op, dtype)
        self.owner = owner

    def run(self, attempt, source: str, variant: str, index: int, cpu_case: Case, device_case: Case):
        description = _describe(*cpu_case)  # before an in-place run changes it
        if self.owner is None:
            verdict = attempt(cpu_case, device_case)
        else:
            before = _kernel_counts(self.owner, self.result.op)
            verdict = attempt(cpu_case, device_case)
            calls, declined = (a - b for a, b in zip(_kernel_counts(self.owner, self.result.op), before))
            if verdict is not _SKIP and calls == 0:
                self.result.declined += bool(declined)
                return
        if verdict is _SKIP:
            return
        self.result.samples += 1
        if verdict is not None:
            self.result.failures.append(SampleFailure(self.result.op, source, self.result.dtype, variant,
                                                      index, description, *verdict))


# --- OpInfo samples ----------------------------------------------------------

def _with_fresh_out(function):
    """The out= variant: outputs shaped like the function's result, on the
    inputs' device, passed as ``out=``; returns them."""
    def run(*args, **kwargs):
        result = function(*args, **kwargs)
        out = tuple(torch.empty_like(t) for t in result) if isinstance(result, (tuple, list)) \
            else torch.empty_like(result)
        function(*args, out=out, **kwargs)
        return out
    return run


def _device_case(info, sample) -> Case:
    dev_input, dev_args, dev_kwargs = sample_to_device(info, sample)
    return (dev_input, *dev_args), dev_kwargs


def _cpu_case(sample) -> Case:
    return (sample.input, *sample.args), sample.kwargs


def _strided(sample) -> bool:
    """Whether every tensor of the sample is strided (max_device refuses
    sparse layouts by design)."""
    layouts = set()

    def note_layout(value):
        if isinstance(value, torch.Tensor):
            layouts.add(value.layout)
        return value

    sample.transform(note_layout)
    return layouts <= {torch.strided}


# --- out= tensors PyTorch resizes or refuses ---------------------------------

def _with_out(function, make_out):
    """The out= variant with outputs made by ``make_out(result)``: PyTorch
    resizes an empty or wrong-size ``out=`` (warning for a non-empty one),
    so the kernel sees it as the user passed it."""
    def run(*args, **kwargs):
        result = function(*args, **kwargs)
        out = tuple(make_out(t) for t in result) if isinstance(result, (tuple, list)) else make_out(result)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
            function(*args, out=out, **kwargs)
        return out
    return run


def _empty_out(t: torch.Tensor) -> torch.Tensor:
    # Empty, over a storage big enough for the result: a kernel that writes
    # without resizing shows a wrong result instead of corrupting the heap.
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[:0]


def _wrong_size_out(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(s + 1 for s in t.shape) or (2,), dtype=t.dtype, device=t.device)


def _overlapping_out(function):
    """out= shifted by one element against the first input, in one buffer:
    PyTorch refuses such a partial overlap, a kernel must too."""
    def run(x, *args, **kwargs):
        n = x.numel()
        buffer = torch.empty(n + 1, dtype=x.dtype, device=x.device)
        buffer[:n].copy_(x.reshape(-1))
        return function(buffer[:n].view(x.shape), *args, out=buffer[1:].view(x.shape), **kwargs)
    return run


def _overlap_applies(info, sample) -> bool:
    """Whether an out= shaped like the sample's first input is the op's output."""
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.numel() < 2:
        return False
    try:
        result = info.op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - the CPU refuses it: nothing to check
        return False
    return isinstance(result, torch.Tensor) and result.shape == x.shape and result.dtype == x.dtype


# --- Extremal inputs ---------------------------------------------------------
# OpInfo's samples are small values in small, mostly contiguous tensors: a
# softmax without max subtraction or a kernel that ignores strides passes
# them. Each kind below derives a sample from an OpInfo sample, applied the
# same way on the CPU and on max_device (the layout is kept by to_device).

def _large(t):
    return t * 100 if t.is_floating_point() else t


def _empty(t):
    return t[:0] if t.dim() > 0 else t


def _zero_dim(t):
    return t.reshape(-1)[:1].reshape(()) if t.numel() > 0 else t


def _transposed(t):
    return t.mT.contiguous().mT if t.dim() >= 2 else t


def _expanded(t):
    return t.reshape(-1)[:1].reshape(()).expand(t.shape) if t.numel() > 0 else t  # stride 0 everywhere


def _offset(t):
    """The same values at storage offset 1."""
    flat = t.reshape(-1)
    return torch.cat([flat[:1], flat])[1:].view(t.shape) if t.numel() > 0 else t


EXTREMAL_KINDS = {"large_values": _large, "empty": _empty, "zero_dim": _zero_dim, "transposed": _transposed,
                  "expanded": _expanded, "offset": _offset}


def _extremal_samples(sample):
    """(kind, sample) pairs derived from one OpInfo sample."""
    def tensors_only(fn):
        return lambda t: fn(t) if isinstance(t, torch.Tensor) else t
    for kind, fn in EXTREMAL_KINDS.items():
        yield kind, sample.transform(tensors_only(fn))
    # broadcasting in either direction: one of two same-shaped operands cut to size 1
    x = sample.input
    other = sample.args[0] if sample.args else None
    if isinstance(x, torch.Tensor) and isinstance(other, torch.Tensor) and x.shape == other.shape \
            and x.dim() > 0 and x.shape[0] > 1:
        yield "broadcast_input", type(sample)(x[:1], args=sample.args, kwargs=sample.kwargs)
        yield "broadcast_other", type(sample)(x, args=(other[:1], *sample.args[1:]), kwargs=sample.kwargs)


def _compare_at_scale(run):
    """For large inputs, where summation order legitimately moves results by
    more than OpInfo's tolerances: NaN and infinities where the CPU has
    them, finite values within 1e-3 of the output's largest magnitude."""
    def attempt(cpu_case, device_case):
        try:
            expected = run(*cpu_case[0], **cpu_case[1])
        except Exception:  # noqa: BLE001 - an input the op refuses: nothing to compare
            return _SKIP
        tolerance = {}
        if isinstance(expected, torch.Tensor) and expected.is_floating_point():
            finite = expected[expected.isfinite()]
            scale = float(finite.abs().max()) if finite.numel() else 1.0
            tolerance = {"rtol": 1e-3, "atol": 1e-3 * max(scale, 1.0)}
        return _compare(run, lambda *a, **k: expected, cpu_case, device_case, tolerance)
    return attempt


# --- Gradients ---------------------------------------------------------------

def _leaves(value) -> list:
    return torch.utils._pytree.tree_leaves(value)


def _requiring_grad(device_case: Case, cpu_case: Case) -> Case:
    """The device case with requires_grad set where the CPU case has it."""
    for cpu, dev in zip(_leaves(cpu_case), _leaves(device_case)):
        if isinstance(cpu, torch.Tensor) and cpu.requires_grad and isinstance(dev, torch.Tensor):
            dev.requires_grad_()
    return device_case


def _gradients(function, process, args, kwargs):
    """The gradients of sum(w * outputs) with respect to every input that
    requires grad, with fixed weights w; None for an input autograd did not
    reach."""
    inputs = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    outputs = [o for o in _leaves(process(function(*args, **kwargs)))
               if isinstance(o, torch.Tensor) and o.is_floating_point()]
    if not inputs or not outputs:
        raise ValueError("nothing to differentiate")
    weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape).to(o.device) for o in outputs]
    pairs = [(o, w) for o, w in zip(outputs, weights) if o.requires_grad]
    if not pairs:
        return [None] * len(inputs)
    grads = torch.autograd.grad([o for o, _ in pairs], inputs, [w for _, w in pairs], allow_unused=True)
    return [None if g is None else g.detach().cpu() for g in grads]


def _compare_gradients(function, reference, process, tolerance: dict):
    """An attempt comparing the gradients through ``function`` on max_device
    with those through ``reference`` on the CPU."""
    def attempt(cpu_case, device_case):
        try:
            expected = _gradients(reference, process, *cpu_case)
        except Exception:  # noqa: BLE001 - no gradient on the CPU: nothing to compare
            return _SKIP
        try:
            actual = _gradients(function, process, *device_case)
        except Exception as e:  # noqa: BLE001 - any failure is a finding
            return math.nan, math.nan, f"backward raised {type(e).__name__}: {e}"
        for k, (want, got) in enumerate(zip(expected, actual)):
            if want is None and got is None:
                continue
            if got is None or want is None:
                return math.nan, math.nan, (
                    f"gradients broken: the gradient of input {k} is {'None' if got is None else 'set'} on "
                    f"max_device where the CPU's is {'None' if want is None else 'set'}")
            try:
                torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
            except AssertionError as e:
                return (*_errors(want, got), f"gradients broken: the gradient of input {k} differs from the "
                        f"CPU's: {e}")
        return None
    return attempt


def _check_extras(tally: _Tally, info, dtype: torch.dtype, source: str, tolerance: dict) -> None:
    """out= edge cases, extremal inputs and gradients, on the first two
    samples of the OpInfo."""
    def compare(run):
        return lambda cpu, dev: _compare(run, run, cpu, dev, tolerance)

    strided = filter(_strided, info.reference_inputs("cpu", dtype, requires_grad=False))
    for index, sample in zip(range(2), strided):
        if info.supports_out:
            tally.run(compare(_with_out(info.op, _empty_out)), source, "out_empty", index, _cpu_case(sample),
                      _device_case(info, sample))
            tally.run(compare(_with_out(info.op, _wrong_size_out)), source, "out_wrong_size", index,
                      _cpu_case(sample), _device_case(info, sample))
            if _overlap_applies(info, sample):
                tally.run(lambda cpu, dev: _expect_error(_overlapping_out(info.op), cpu, dev), source,
                          "out_overlap", index, _cpu_case(sample), _device_case(info, sample))
        for kind, extremal in _extremal_samples(sample):
            attempt = _compare_at_scale(info.op) if kind == "large_values" else compare(info.op)
            tally.run(attempt, source, f"extremal_{kind}", index, _cpu_case(extremal), _device_case(info, extremal))
    if info.supports_autograd and dtype.is_floating_point:
        for index, sample in zip(range(2), filter(_strided, info.sample_inputs("cpu", dtype, requires_grad=True))):
            cpu_case = _cpu_case(sample)
            tally.run(_compare_gradients(info.op, info.op, sample.output_process_fn_grad, tolerance), source,
                      "autograd", index, cpu_case, _requiring_grad(_device_case(info, sample), cpu_case))


def _check_opinfo(tally: _Tally, info, dtype: torch.dtype, max_samples: int) -> None:
    source = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
    tolerance = opinfo_tolerance(info, dtype)

    def compare(run):
        return lambda cpu, dev: _compare(run, run, cpu, dev, tolerance)

    variants = [("function", compare(info.op))]
    if info.supports_out:
        variants.append(("out", compare(_with_fresh_out(info.op))))
    if info.inplace_variant is not None:
        variants.append(("inplace", compare(info.inplace_variant)))  # last: it changes the CPU input
    # reference_inputs: what PyTorch's own device-vs-CPU test (test_compare_cpu) runs
    strided = filter(_strided, info.reference_inputs("cpu", dtype, requires_grad=False))
    for index, sample in zip(range(max_samples), strided):
        noncontiguous = sample.noncontiguous()
        tally.run(compare(info.op), source, "noncontiguous", index, _cpu_case(noncontiguous),
                  _device_case(info, noncontiguous))
        for variant, attempt in variants:
            tally.run(attempt, source, variant, index, _cpu_case(sample), _device_case(info, sample))
    _check_extras(tally, info, dtype, source, tolerance)
    if info.error_inputs_func is not None:
        for index, error_input in enumerate(info.error_inputs("cpu")):
            sample = error_input.sample_input
            tally.run(lambda cpu, dev: _expect_error(info.op, cpu, dev), source, "error_input", index,
                      _cpu_case(sample), _device_case(info, sample))


# --- Author samples (custom ops, ops without an OpInfo) ----------------------

def _overload(op: str):
    """'myplug::rms_norm' -> torch.ops.myplug.rms_norm.default."""
    namespace, _, name = op.partition("::")
    packet, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _with_grad(case: Case) -> Case:
    """A copy of an author's sample whose floating tensors require grad."""
    def leaf(v):
        return v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() \
            else v
    return torch.utils._pytree.tree_map(leaf, case)


def _check_author_samples(tally: _Tally, op: str, dtype: torch.dtype, make_samples: Callable,
                          reference: Optional[Callable], opcheck_tests: Optional[Sequence[str]]) -> None:
    overload = _overload(op)
    if reference is None and torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"):
        reference = overload  # the op's own CPU kernel
    for index, (args, kwargs) in enumerate(make_samples(dtype)):
        cpu_case = (tuple(args), dict(kwargs))
        tally.run(_opcheck(overload, opcheck_tests), "samples", "opcheck", index, cpu_case,
                  to_device(cpu_case))
        if reference is not None:
            tally.run(lambda cpu, dev: _compare(overload, reference, cpu, dev, {}), "samples", "reference",
                      index, cpu_case, to_device(cpu_case))
            if dtype.is_floating_point and torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autograd"):
                grad_case = _with_grad(cpu_case)
                tally.run(_compare_gradients(overload, reference, lambda out: out, {}), "samples", "autograd",
                          index, grad_case, _requiring_grad(to_device(grad_case), grad_case))


# --- The engine --------------------------------------------------------------

# Manifest dtype mask bits (plugin.h MAXDEV_DTYPE_*), in bit order.
_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.bfloat16, torch.float32, torch.float64,
                torch.complex64, torch.complex128)
# What a kernel that accepts any dtype (mask 0) is checked with by default.
ANY_DTYPE_DEFAULT = (torch.float32, torch.float64, torch.int64)


def _dtypes_of_mask(mask: int) -> Tuple[torch.dtype, ...]:
    return tuple(d for bit, d in enumerate(_MASK_DTYPES) if mask >> bit & 1) or ANY_DTYPE_DEFAULT


def _dtype(value: Union[str, torch.dtype]) -> torch.dtype:
    dtype = getattr(torch, value.replace("torch.", ""), None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {value!r}")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_ops(ops: Iterable[str], dtypes: Union[Sequence, Callable[[str], Sequence]] = (torch.float32,), *,
              owner: Optional[str] = None, samples: Optional[Dict[str, Callable]] = None,
              references: Optional[Dict[str, Callable]] = None, max_samples: int = 8,
              opcheck_tests: Optional[Sequence[str]] = None,
              progress: Optional[Callable[[str], None]] = None) -> List[OpResult]:
    """The engine under ``check_plugin`` and reload validation: one
    ``OpResult`` per (op, dtype). ``dtypes`` is a list, or a function of the
    op giving its list. With ``owner`` (a plugin name) only sample runs that
    reached that plugin's kernel are judged; without, every run is."""
    samples, references = _samples_and_references(samples, references)
    samples, references = samples or {}, references or {}
    missing = set(references) - set(samples)
    if missing:
        raise ValueError(f"references for {sorted(missing)} need samples= to run them on")
    ops = list(ops)
    results: List[OpResult] = []
    for number, op in enumerate(ops, 1):
        started = time.monotonic()
        infos = opinfos_for(op)
        row = []
        for dtype in (dtypes(op) if callable(dtypes) else dtypes):
            dtype = _dtype(dtype)
            tally = _Tally(op, _dtype_name(dtype), owner)
            for info in infos:
                if dtype in info.supported_dtypes("cpu"):
                    _check_opinfo(tally, info, dtype, max_samples)
            if op in samples:
                _check_author_samples(tally, op, dtype, samples[op], references.get(op), opcheck_tests)
            result = tally.result.finish()
            if result.status == NOT_COVERED:
                result.note = "no OpInfo sample reaches this op" if infos or op in samples else \
                    "no OpInfo; pass samples= (and references=) to check it"
            row.append(result)
        results.extend(row)
        if progress:
            verdicts = ", ".join(f"{r.dtype} {r.status} ({r.samples} samples)" for r in row)
            progress(f"[{number}/{len(ops)}] {op}: {verdicts}  {time.monotonic() - started:.1f} s")
    return results


def _selected(served: Sequence[str], ops: Optional[Iterable[str]]) -> List[str]:
    """The served ops named in ``ops`` ("aten::neg.out"; "aten::neg" or
    "neg" for all its overloads); all served ops when ``ops`` is None."""
    if ops is None:
        return list(served)
    wanted = {op if "::" in op else f"aten::{op}" for op in ops}
    chosen = [op for op in served if op in wanted or op.split(".", 1)[0] in wanted]
    unknown = {w for w in wanted if not any(c == w or c.split(".", 1)[0] == w for c in chosen)}
    if unknown:
        raise ValueError(f"the plugin serves none of {sorted(unknown)}; it serves {list(served)}")
    return chosen


def load_samples(path) -> Tuple[Dict[str, Callable], Dict[str, Callable]]:
    """(samples, references) from a Python file that defines ``SAMPLES``
    (op -> fn(dtype) returning (args, kwargs) pairs built on the CPU) and
    optionally ``REFERENCES`` (op -> CPU function): what ``check --samples``
    and ``samples="file.py"`` read."""
    import importlib.util
    import os
    path = os.fspath(path)
    spec = importlib.util.spec_from_file_location(f"max_device_samples_{abs(hash(path))}", path)
    if spec is None or not os.path.isfile(path):
        raise ValueError(f"{path}: no such samples file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    samples = getattr(module, "SAMPLES", None)
    if not isinstance(samples, dict):
        raise ValueError(f"{path}: a samples file defines SAMPLES = {{op: fn(dtype) -> [(args, kwargs), ...]}}")
    return samples, dict(getattr(module, "REFERENCES", {}))


def _samples_and_references(samples, references):
    """samples= as a dict, or a path to a samples file (which gives both)."""
    if samples is None or isinstance(samples, dict):
        return samples, references
    from_file, file_references = load_samples(samples)
    return from_file, {**file_references, **(references or {})}


_FLAG_NAMES = {1: "contiguous_only", 2: "same_dtype", 4: "no_cpu_tensors"}


def kernel_capabilities(kernel) -> dict:
    """A manifest kernel's declared dtypes and flags, by name."""
    dtypes = [_dtype_name(d) for bit, d in enumerate(_MASK_DTYPES) if kernel.dtypes >> bit & 1] or ["any"]
    flags = [name for bit, name in _FLAG_NAMES.items() if kernel.flags & bit]
    unknown = kernel.flags & ~sum(_FLAG_NAMES)
    return {"op": kernel.op, "dtypes": dtypes, "flags": flags + ([hex(unknown)] if unknown else [])}


def check_plugin(plugin_or_path, ops: Optional[Iterable[str]] = None, dtypes: Optional[Sequence] = None, *,
                 samples: Optional[Dict[str, Callable[[torch.dtype], Iterable[Case]]]] = None,
                 references: Optional[Dict[str, Callable]] = None, max_samples: int = 8,
                 opcheck_tests: Optional[Sequence[str]] = None, quiet: bool = False) -> CheckResult:
    """Check every op a plugin serves against the CPU.

    ``plugin_or_path``: a loaded ``max_device.Plugin``, or a plugin file
    (loaded for the check and unloaded after it). ``ops`` limits the check
    to some served ops; ``dtypes`` (torch dtypes or names) replaces the
    dtypes each kernel declares in its manifest (a kernel that accepts any
    dtype is checked with ``ANY_DTYPE_DEFAULT``).

    Ops with OpInfo entries run up to ``max_samples`` samples of each entry
    (plain, non-contiguous, ``out=``, in-place) and all its error inputs,
    at OpInfo's tolerances. Other ops (custom ops) need samples from the
    author: ``samples={"myplug::rms_norm": fn}`` where ``fn(dtype)`` returns
    an iterable of ``(args, kwargs)`` built on the CPU (they are copied to
    max_device). Each sample runs ``torch.library.opcheck`` (the tests named
    in ``opcheck_tests``, default all of opcheck's), and is compared with
    ``references[op](*args, **kwargs)`` on the CPU when given (an aten op
    without an OpInfo is compared with its own CPU kernel).

    ``samples`` may also be the path of a samples file (``load_samples``).
    Every op is also checked with empty, wrong-size and overlapping ``out=``
    tensors, extremal inputs and (floating dtypes) its gradients against
    the CPU's; a custom op with a backward op has its gradients compared
    with those of its reference.

    Progress goes to stderr, one line per op, unless ``quiet``. Returns a
    ``CheckResult``: ``.passed``, ``.failures``, ``.uncovered``,
    ``.table()``, ``.to_json()``.
    """
    from .plugins import Plugin, inspect, load_plugin, unload_plugin
    started = time.monotonic()
    loaded_here = not isinstance(plugin_or_path, Plugin)
    samples, references = _samples_and_references(samples, references)
    plugin = load_plugin(plugin_or_path) if loaded_here else plugin_or_path
    try:
        manifest = inspect(plugin.snapshot)
        masks = {k.op: k.dtypes for k in manifest.kernels}
        results = check_ops(
            _selected(plugin.ops, ops),
            dtypes if dtypes is not None else lambda op: _dtypes_of_mask(masks.get(op, 0)),
            owner=plugin.name, samples=samples, references=references, max_samples=max_samples,
            opcheck_tests=opcheck_tests,
            progress=None if quiet else lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        if loaded_here:
            unload_plugin(plugin)
    return CheckResult(plugin.name, plugin.path, results, time.monotonic() - started,
                       [kernel_capabilities(k) for k in manifest.kernels])
