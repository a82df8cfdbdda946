"""Which overload of an op a plugin kernel should serve, read from
PyTorch's dispatcher (``python -m max_device schema NAME``).

A kernel only helps where PyTorch's dispatcher would reach it with
autograd intact:

- a **composite implicit** op (``aten::softmax.int``) is decomposed by
  PyTorch into other ops, which also gives its gradients; a kernel on it
  replaces the forward and loses the gradients, so the loader refuses it
  (unless ``allow_composite=True``): serve the op it decomposes into;
- a **structured** functional or in-place op (``aten::add.Tensor``) is
  computed by its ``.out`` overload (``aten::add.out``): one kernel there
  serves all three forms;
- anything else is served as is; ops with an autograd formula keep their
  gradients whoever computes the forward.
"""

import dataclasses
from typing import List

import torch

from . import _C
from ._structured import _delegates

_EXPLICIT_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


@dataclasses.dataclass
class Overload:
    name: str              # "aten::softmax.int"
    schema: str
    kind: str              # composite implicit, composite explicit, structured, structured out=, backend kernels
    autograd: str          # what gives its gradients
    outputs: List[int]     # argument positions it writes (out=, in-place)
    serve: str             # the overload a plugin kernel should serve for it

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        written = ", ".join(map(str, self.outputs)) or "none (returns new tensors)"
        advice = "serve this overload" if self.serve == self.name else f"serve {self.serve} instead" \
            if self.serve else "serve the ops it decomposes into"
        return (f"{self.name}\n  schema:   {self.schema}\n  kind:     {self.kind}\n"
                f"  autograd: {self.autograd}\n  outputs:  argument positions {written}\n  kernel:   {advice}")


def _has(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def _describe(schema) -> Overload:
    name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    delegates = _delegates()
    delegate = next((out for out, variants in delegates.items() if name in variants), None)
    if _has(name, "CompositeImplicitAutograd"):
        kind, autograd, serve = "composite implicit", "by decomposition (the ops it calls)", \
            _C._overload_to_serve(name)
    elif delegate is not None:
        kind, autograd, serve = f"structured (computed by {delegate})", \
            "own formula" if _has(name, "Autograd") else "none", delegate
    else:
        kind = "structured out=" if name in delegates else \
            "composite explicit" if any(_has(name, k) for k in _EXPLICIT_KEYS) else "backend kernels"
        autograd = "own formula" if _has(name, "Autograd") else "none"
        serve = name
    outputs = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    return Overload(name, str(schema), kind, autograd, outputs, serve)


def overloads(name: str) -> List[Overload]:
    """Every overload of ``name`` ("softmax", "aten::softmax" or one
    overload, "aten::softmax.int"). Raises ValueError for an unknown op."""
    qualified = name if "::" in name else f"aten::{name}"
    packet, _, overload = qualified.partition(".")
    found = [s for s in torch._C._jit_get_schemas_for_operator(packet)
             if not overload or s.overload_name == overload]
    if not found:
        raise ValueError(f"no operator named {name!r} (try `python -m max_device schema softmax`)")
    return [_describe(s) for s in found]
