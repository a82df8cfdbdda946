"""Checking kernels against PyTorch's own OpInfo samples.

PyTorch's OpInfo database (``op_db``, in the wheel) holds sample inputs and
tolerances for every op it tests. These helpers move samples to max_device
keeping their memory layout, find the OpInfos that exercise an aten op, and
compare what max_device computes with the CPU. Reload validation
(``reload_plugin(..., validate=True)``) and the test suite use them.
"""

import dataclasses
import functools
import math
from typing import Dict, Iterable, List, Optional, Sequence

import torch

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
        return torch.empty(0, dtype=t.dtype, device=DEVICE).set_(
            dev_storage, t.storage_offset(), t.size(), t.stride())
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
    component."""
    base = _base_name(op)
    return [info for info in _op_db()
            if base in {(info.aten_name or "").strip("_"), info.name.split(".")[-1].strip("_")}]


@dataclasses.dataclass
class Mismatch:
    op: str             # the aten op checked
    opinfo: str         # "name" or "name.variant"
    dtype: str
    sample: int         # index of the sample
    description: str    # the sample's shapes
    max_abs: float      # largest absolute difference (nan: not comparable)
    max_rel: float
    error: str          # assert_close's message, or the exception

    def __str__(self) -> str:
        return (f"{self.op} [{self.opinfo}, {self.dtype}, sample {self.sample}: {self.description}]: "
                f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}: {self.error.splitlines()[0]}")


def _describe(sample) -> str:
    def shape(v):
        return f"{tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
    return ", ".join([shape(sample.input)] + [shape(a) for a in sample.args])


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


def compare_with_cpu(ops: Iterable[str], dtypes: Sequence[torch.dtype] = (torch.float32,),
                     max_samples: int = 8) -> Dict[str, List[Mismatch]]:
    """Run the OpInfo samples of every op in ``ops`` on max_device and on the
    CPU, compare at assert_close's defaults for the dtype, and return
    ``{op: [mismatches]}`` for the ops that have OpInfo samples (ops with
    none are absent). Exceptions on max_device that the CPU does not raise
    count as mismatches."""
    report: Dict[str, List[Mismatch]] = {}
    for op in ops:
        infos = opinfos_for(op)
        if not infos:
            continue
        found = report.setdefault(op, [])
        for info in infos:
            label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
            for dtype in dtypes:
                if dtype not in info.supported_dtypes("cpu"):
                    continue
                samples = info.sample_inputs("cpu", dtype, requires_grad=False)
                for index, sample in zip(range(max_samples), samples):
                    try:
                        expected = info(sample.input, *sample.args, **sample.kwargs)
                    except Exception:  # noqa: BLE001 - nothing to compare with
                        continue
                    d_input, d_args, d_kwargs = to_device((sample.input, sample.args, sample.kwargs))
                    try:
                        actual = to_cpu(info(d_input, *d_args, **d_kwargs))
                        torch.testing.assert_close(actual, expected, equal_nan=True)
                    except Exception as e:  # noqa: BLE001 - any failure is a finding
                        abs_err, rel_err = _errors(expected, locals().get("actual"))
                        found.append(Mismatch(op, label, str(dtype).replace("torch.", ""), index,
                                              _describe(sample), abs_err, rel_err,
                                              f"{type(e).__name__}: {e}"))
    return report
