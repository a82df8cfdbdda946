"""The CPU fallback: see it, count it, and decide whether it is allowed.

Every op without a max_device kernel runs PyTorch's CPU kernel on the device
tensors' own bytes. The policy says what happens when it does:
``allow`` (silently), ``warn`` (a UserWarning once per op) or ``error``
(NotImplementedError naming the op). Set it globally or per op, here or with
the environment variable ``MAX_DEVICE_FALLBACK`` read at import, e.g.
``MAX_DEVICE_FALLBACK=warn,aten::mm=error``.
"""

import functools
from typing import Dict, Optional

import torch

from . import _C

_POLICIES = ("allow", "warn", "error")


def set_fallback_policy(policy: Optional[str], op: Optional[str] = None) -> None:
    """Set the fallback policy globally, or for one op (``"aten::mm"``,
    ``"aten::add.out"``). ``policy=None`` with ``op`` removes that op's
    override."""
    if op is None:
        if policy is None:
            raise ValueError("the global fallback policy cannot be None; use 'allow', 'warn' or 'error'")
        _C._set_fallback_policy(policy)
    else:
        _C._set_op_fallback_policy(_qualified(op), policy)


def fallback_policy(op: Optional[str] = None) -> str:
    """The policy in force globally, or for ``op``."""
    if op is None:
        return _C._fallback_policy()
    return _C._op_fallback_policies().get(_qualified(op), _C._fallback_policy())


def fallback_counts() -> Dict[str, int]:
    """How many calls of each op ran on the CPU fallback."""
    return dict(sorted(_C._fallback_counts().items()))


def reset_fallback_counts() -> None:
    _C._reset_fallback_counts()


def _qualified(op: str) -> str:
    """'mm' -> 'aten::mm'; an op PyTorch does not know is refused (a policy
    for it would silently never apply)."""
    if not isinstance(op, str) or not op:
        raise TypeError(f"op must be an operator name such as 'aten::mm', got {op!r}")
    qualified = op if "::" in op else f"aten::{op}"
    name, _, overload = qualified.partition(".")
    known = torch._C._dispatch_find_schema_or_throw  # raises for an unknown (name, overload)
    try:
        if overload:
            known(name, overload)
        elif not any(n == name or n.startswith(name + ".") for n in _op_names()):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"{qualified} is not an operator PyTorch knows; a fallback policy names an op "
                         f"('aten::mm') or one overload ('aten::add.out')") from None
    return qualified


def _op_names():
    return torch._C._dispatch_get_all_op_names()


def _ending_direct_fallbacks(impl):
    """Library.impl: a kernel about to be registered on the device key
    replaces max_device's own fallback kernel for that op (and, for an out=
    op, the direct fallbacks of the forms computed with it) first, so the
    dispatcher has nothing to override."""
    @functools.wraps(impl)
    def registering(self, op_name, fn, dispatch_key="", *args, **kwargs):
        key = dispatch_key or self.dispatch_key
        if key == "PrivateUse1" and self.ns == "aten":
            name = self._resolve_op_name(op_name, "impl")
            _C._end_direct_fallbacks(name if "::" in name else f"aten::{name}")
        return impl(self, op_name, fn, dispatch_key, *args, **kwargs)

    registering.max_device_refreshes = True
    return registering


def _suspending_direct_fallbacks(load_library):
    """torch.ops.load_library: a C++ library's TORCH_LIBRARY_IMPL registers
    while it loads, over whichever op it names; max_device's fallback
    kernels step aside meanwhile and come back for the ops it left alone."""
    @functools.wraps(load_library)
    def loading(*args, **kwargs):
        _C._suspend_direct_fallbacks()
        try:
            return load_library(*args, **kwargs)
        finally:
            _C._resume_direct_fallbacks()

    loading.max_device_refreshes = True
    return loading


def install_registration_hooks() -> None:
    """A kernel someone registers on the max_device key for an op
    (``torch.library.impl("aten::add.out", "max_device")``, or a C++
    TORCH_LIBRARY_IMPL loaded with ``torch.ops.load_library``) replaces
    max_device's fallback kernel for it and ends the direct fallbacks of
    the forms PyTorch computes with it, so ``torch.add(a, b)`` reaches it
    through PyTorch's composite as on any device. Idempotent."""
    for owner, name, hook in ((torch.library.Library, "impl", _ending_direct_fallbacks),
                              (torch._ops._Ops, "load_library", _suspending_direct_fallbacks)):
        register = getattr(owner, name)
        if not getattr(register, "max_device_refreshes", False):
            setattr(owner, name, hook(register))
