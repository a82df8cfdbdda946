"""Which of PyTorch's core ops max_device runs, and how.

The core ops are the aten OpOverloads PyTorch tags ``torch.Tag.core`` (the
set export/compile decompose to). For each one this reports what actually
runs for a max_device tensor, in the order PyTorch's dispatcher picks it:

- ``plugin``: a loaded plugin's kernel, directly or through the ``.out``
  kernel a structured op delegates to (``add.Tensor`` via ``add.out``);
- ``max_device``: a kernel max_device registers itself: its device runtime
  (factories, views, copies);
- ``composite``: a composite kernel that decomposes it into other ops;
- ``fallback``: PyTorch's CPU kernel through the zero-copy fallback:
  directly (a structured form runs its own CPU kernel while nothing serves
  it or its ``.out`` op), through the ``.out`` kernel it delegates to, or
  through a loader trampoline no plugin serves now (which wins over a
  composite: ``native_layer_norm``);
- ``none``: no kernel anywhere: a call fails.
"""

import dataclasses
import functools
from typing import Dict, List

import torch

from . import _C
from ._structured import _delegates

CATEGORIES = ("plugin", "max_device", "composite", "fallback", "none")

_COMPOSITE_KEYS = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd",
                   "CompositeImplicitAutograd")


@functools.lru_cache(maxsize=None)
def core_ops() -> List[str]:
    """Names ("aten::add.Tensor", "aten::relu") of the aten ops tagged core."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name[len("aten::"):], None)
        overload = getattr(packet, schema.overload_name or "default", None) if packet else None
        if overload is not None and torch.Tag.core in overload.tags:
            names.add(overload.name())
    return sorted(names)


@dataclasses.dataclass
class CoverageReport:
    """``ops``: core op -> category; ``providers``: core op -> who serves it
    (for ``plugin``: "name@version", plus "via <op>" for structured variants)."""

    ops: Dict[str, str]
    providers: Dict[str, str]

    def counts(self) -> Dict[str, int]:
        return {c: sum(1 for v in self.ops.values() if v == c) for c in CATEGORIES}

    def by_category(self, category: str) -> List[str]:
        return [op for op, c in self.ops.items() if c == category]

    def to_json(self) -> dict:
        return {"core_ops": len(self.ops), "counts": self.counts(),
                "ops": {c: {op: self.providers.get(op, "") for op in self.by_category(c)} for c in CATEGORIES}}

    def __str__(self) -> str:
        counts = self.counts()
        lines = [f"{len(self.ops)} core aten ops (torch.Tag.core): "
                 + ", ".join(f"{counts[c]} {c}" for c in CATEGORIES)]
        for category in CATEGORIES:
            ops = self.by_category(category)
            lines.append(f"\n{category} ({len(ops)}):")
            lines.extend(f"  {op}" + (f"  [{self.providers[op]}]" if op in self.providers else "")
                         for op in ops)
        return "\n".join(lines)


def core_op_coverage(*plugins) -> CoverageReport:
    """How each core op runs on max_device now. With plugin arguments (Plugin
    objects or names) only their kernels count as ``plugin``; the ops of
    other loaded plugins are classified as if those were not loaded."""
    names = {p if isinstance(p, str) else p.name for p in plugins}
    served: Dict[str, str] = {}
    for entry in _C._list_ops():
        owners = [l["owner"] for l in entry["layers"]
                  if l["kind"] == "plugin" and (not names or l["owner"].split("@", 1)[0] in names)]
        if owners:
            served[entry["op"]] = owners[-1]
    delegate_of = {variant: out for out, variants in _delegates().items() for variant in variants}
    # max_device's own PrivateUse1 kernels: the loader's trampolines register
    # on the same key (and stay after their last provider leaves)
    trampolines = set(_C._trampoline_ops())
    direct = set(_C._direct_fallback_ops())
    device_kernels = set(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")) \
        - trampolines - direct

    ops, providers = {}, {}
    for op in core_ops():
        delegate = delegate_of.get(op)
        if op in served:
            ops[op], providers[op] = "plugin", served[op]
        elif delegate in served:
            ops[op], providers[op] = "plugin", f"{served[delegate]} via {delegate}"
        elif op in direct:
            ops[op] = "fallback"
        elif delegate is not None:  # the structured composite calls the .out op, which falls back
            ops[op], providers[op] = "fallback", f"via {delegate}"
        elif op in device_kernels:
            ops[op] = "max_device"
        elif op in trampolines:  # no provider now: its trampoline runs the CPU's kernel
            ops[op] = "fallback"
        elif any(torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for key in _COMPOSITE_KEYS):
            ops[op] = "composite"
        elif torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"):
            ops[op] = "fallback"
        else:
            ops[op] = "none"
    return CoverageReport(ops, providers)
