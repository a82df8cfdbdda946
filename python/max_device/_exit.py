"""A clean interpreter exit after a backward pass on max_device.

PyTorch's autograd engine runs a device's part of a backward pass on a
thread of its own (``pt_autograd_<index>``). Each ``backward()`` captures a
Python object in the task's thread-local state (a ``contextvars`` context,
``torch.autograd.graph._engine_run_backward``), and that thread often drops
the task, and with it the Python object, just after ``backward()`` returns.
If the interpreter is already finalizing by then, CPython ends the thread
with ``pthread_exit`` while it waits for the GIL; the forced unwind crosses
a ``noexcept`` destructor and the process aborts ("terminate called without
an active exception"). It happens to any PrivateUse1 backend, a pure-Python
one too; upstream: pytorch/pytorch#38228 (C++ threads calling into Python
during finalization).

Workaround: at exit, while Python still runs, pass one tiny backward through
each device thread directly to the C++ engine (without capturing a Python
object). A device thread handles tasks one after the other and drops each
before taking the next, so once that task is done the previous one is gone,
and the new one holds nothing that needs the GIL.
"""

import atexit
import os

import torch


def _autograd_device_threads_started() -> bool:
    """Whether PyTorch's engine has started its device threads (it starts
    them all at the first backward that needs one): none, nothing to drain."""
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
        except OSError:
            continue  # the thread ended meanwhile
    return False


def drain_autograd_device_threads(device_type: str, device_count: int) -> None:
    if not _autograd_device_threads_started():
        return
    engine = torch.autograd.graph.Variable._execution_engine
    for index in range(device_count):
        leaf = torch.zeros((), device=torch.device(device_type, index), requires_grad=True)
        root = leaf * 1.0  # a node whose backward runs on that device's thread
        engine.run_backward((root,), (torch.ones_like(root),), False, False, (), True, True)


def register(device_type: str, device_count) -> None:
    def drain() -> None:
        try:
            drain_autograd_device_threads(device_type, device_count())
        except Exception:  # noqa: BLE001 - exiting anyway; the workaround is best effort
            pass

    atexit.register(drain)
