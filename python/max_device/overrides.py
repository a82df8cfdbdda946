"""Python functions as the top provider of an op on max_device.

    @max_device.override("aten::relu")
    def my_relu(x):
        return x.clamp(min=0)

    with max_device.override("aten::mm.out", lambda self, mat2, *, out: NotImplemented):
        ...                          # leaving restores exactly the previous stack

The function receives the op's arguments (keyword-only ones as keywords)
and returns its result, or ``NotImplemented`` to decline: the call passes to
the layer below (a plugin, or the CPU fallback). Inside the function, a call
of the same op skips this override, so it can delegate to the layer below.
Overrides sit above every plugin, the latest on top. The trampoline is
registered with PyTorch once per op, so no "Overriding a previously
registered kernel" warning appears however often you override.
"""

import atexit
import threading
from typing import Callable, Optional

from . import _C

# Overrides hold Python functions: they leave while the interpreter still
# runs, whatever the program forgot to remove.
atexit.register(_C._remove_all_overrides)


class Override:
    """One installed override; a context manager that removes it on exit."""

    def __init__(self, op: str, fn: Callable):
        if not callable(fn):
            raise TypeError(f"override of {op}: expected a callable, got {fn!r}")
        self.op = op if "::" in op else f"aten::{op}"
        self.fn = fn
        label = getattr(fn, "__qualname__", None) or type(fn).__name__
        self._token: Optional[int] = _C._push_override(self.op, fn, label)
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._token is not None

    def remove(self) -> None:
        """Remove this override (idempotent); the stack below is untouched."""
        with self._lock:
            token, self._token = self._token, None
        if token is not None:
            _C._remove_override(token)

    def __enter__(self) -> "Override":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<max_device.Override {self.op} -> {self.fn!r}{'' if self.active else ' (removed)'}>"


def override(op: str, fn: Optional[Callable] = None):
    """Install ``fn`` as the top provider of ``op`` ("aten::relu",
    "aten::add.out", or a plugin's custom op). Returns an ``Override`` (also
    a context manager). Without ``fn``, returns a decorator that installs the
    decorated function and returns it, with the ``Override`` as its
    ``max_device_override`` attribute."""
    if fn is not None:
        return Override(op, fn)

    def decorate(function: Callable) -> Callable:
        function.max_device_override = Override(op, function)
        return function

    return decorate


def restore(op: str) -> int:
    """Remove every override of ``op``; returns how many there were."""
    return _C._restore(op if "::" in op else f"aten::{op}")
