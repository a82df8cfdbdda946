"""The CPU fallback: see it, count it, and decide whether it is allowed.

Every op without a max_device kernel runs PyTorch's CPU kernel on the device
tensors' own bytes. The policy says what happens when it does:
``allow`` (silently), ``warn`` (a UserWarning once per op) or ``error``
(NotImplementedError naming the op). Set it globally or per op, here or with
the environment variable ``MAX_DEVICE_FALLBACK`` read at import, e.g.
``MAX_DEVICE_FALLBACK=warn,aten::mm=error``.
"""

from typing import Dict, Optional

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
    if not isinstance(op, str) or not op:
        raise TypeError(f"op must be an operator name such as 'aten::mm', got {op!r}")
    return op if "::" in op else f"aten::{op}"
