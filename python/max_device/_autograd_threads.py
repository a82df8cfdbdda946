"""PyTorch's autograd device threads and max_device.

Where the backward runs. PyTorch's autograd engine runs each non-CPU
device's nodes on a thread of its own (``pt_autograd_<index>``), which suits
a device that queues work to its own hardware. max_device's kernels run on
the host's cores, like the CPU's, so that thread only adds a hand-off to
another thread and moves the working set to whichever core it runs on:
measured on a 2-core VM (one torch thread), the small GPT's compiled
training step took 1.62 ms with the hand-off and 1.19 ms without it (CPU:
1.07 ms), and pinned to one core the two differed by 57 us. So ``import
max_device`` runs backward passes as the CPU's run, on the thread that calls
``backward()``: it turns off the engine's multithreading
(``torch.autograd.set_multithreading_enabled(False)``, a per-thread
setting) on the importing thread. Results are the same either way; a
process that also drives several CUDA devices from one thread and wants
their backward passes to overlap turns it back on with
``torch.autograd.set_multithreading_enabled(True)``, and any other thread
that trains on max_device may turn it off the same way.

A clean interpreter exit. When the device thread does run (multithreading
on, or on another thread), each ``backward()`` captures a Python object in
the task's thread-local state (a ``contextvars`` context,
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
        with torch.autograd.set_multithreading_enabled(True):
            engine.run_backward((root,), (torch.ones_like(root),), False, False, (), True, True)


def register(device_type: str, device_count) -> None:
    torch.autograd.set_multithreading_enabled(False)  # backward on the calling thread (this thread)

    def drain() -> None:
        try:
            drain_autograd_device_threads(device_type, device_count())
        except Exception:  # noqa: BLE001 - exiting anyway; the workaround is best effort
            pass

    atexit.register(drain)
