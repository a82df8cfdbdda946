"""Checking kernels against PyTorch's own OpInfo samples.

PyTorch's OpInfo database (``op_db``, in the wheel) holds sample inputs and
tolerances for every op it tests. ``check_plugin`` runs them for every op a
plugin serves, on max_device against the CPU: plain, non-contiguous,
in-place and ``out=`` variants, and the ``error_inputs`` that must raise.
Ops without an OpInfo (custom ops) are checked with
``torch.library.opcheck`` and an author's reference function on the author's
samples. Reload validation (``validate=True``), the isolated check and
``python -m max_device check`` all run this one engine.
"""

import dataclasses
import functools
import math
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .coverage import CoverageReport, core_op_coverage  # noqa: F401  (public through max_device.testing)

DEVICE = "max_device"


def to_device(value, storages: Optional[dict] = None):
    """Copy a sample to max_device, keeping its memory layout: tensors that
    share a CPU storage share one device storage, with the same storage
    offset and strides (as_strided samples index into the whole storage,
    and error_inputs test out= tensors that overlap their inputs)."""
    storages = {} if storages is None else storages
    if isinstance(value, torch.Tensor):
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
        return moved._neg_view() if t.is_neg() else moved
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
    variant: str        # function, noncontiguous, out, inplace, error_input, reference, opcheck
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

    @property
    def passed(self) -> bool:
        return not any(r.status == FAILED for r in self.results)

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
                      "seconds": self.seconds, "results": results})


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

    Progress goes to stderr, one line per op, unless ``quiet``. Returns a
    ``CheckResult``: ``.passed``, ``.failures``, ``.table()``, ``.to_json()``.
    """
    from .plugins import Plugin, inspect, load_plugin, unload_plugin
    started = time.monotonic()
    loaded_here = not isinstance(plugin_or_path, Plugin)
    plugin = load_plugin(plugin_or_path) if loaded_here else plugin_or_path
    try:
        masks = {k.op: k.dtypes for k in inspect(plugin.snapshot).kernels}
        results = check_ops(
            _selected(plugin.ops, ops),
            dtypes if dtypes is not None else lambda op: _dtypes_of_mask(masks.get(op, 0)),
            owner=plugin.name, samples=samples, references=references, max_samples=max_samples,
            opcheck_tests=opcheck_tests,
            progress=None if quiet else lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        if loaded_here:
            unload_plugin(plugin)
    return CheckResult(plugin.name, plugin.path, results, time.monotonic() - started)
