"""Ordinary process life around a development session: exiting with an
override still installed, exiting right after a backward pass, and fork()
(with a thread inside a kernel call, and children that exit normally)."""

import concurrent.futures
import os
import sys
import threading

import pytest
import torch

import max_device
from conftest import run_python

DEVICE = "max_device"


@pytest.mark.parametrize("form", ["context manager never exited", "decorator", "override object dropped"])
def test_exit_with_an_override_installed_is_clean(form):
    body = {
        "context manager never exited": "max_device.override('aten::relu', lambda x: x.clamp(min=0)).__enter__()",
        "decorator": "@max_device.override('aten::relu')\ndef my_relu(x):\n    return x.clamp(min=0)",
        "override object dropped": "max_device.override('aten::relu', lambda x: x.clamp(min=0))",
    }[form]
    done = run_python(f"import torch, max_device\n{body}\n"
                      "print(torch.relu(torch.tensor([-1.0, 2.0], device='max_device')).tolist())", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[0.0, 2.0]"


# Before the workaround, a fresh interpreter that ran a backward pass on
# PyTorch's autograd device thread aborted at exit in about half the runs
# ("terminate called without an active exception"). max_device runs the
# backward on the calling thread; a user may turn the device thread back on
# (PyTorch's per-thread switch), and a thread that did not import max_device
# uses it. MAXDEV_EXIT_RUNS=200 runs the soak.
EXIT_RUNS = int(os.environ.get("MAXDEV_EXIT_RUNS", "12"))
BACKWARD_THEN_EXIT = """
import threading, torch, max_device
def backward():
    x = torch.randn(64, 64, device="max_device", requires_grad=True)
    (x @ x).relu().sum().backward()
    assert x.grad.device.type == "max_device"
"""
BACKWARD_ON = {
    "the calling thread": "backward()",
    "the autograd device thread": "torch.autograd.set_multithreading_enabled(True)\nbackward()",
    "the device thread, from another thread": "t = threading.Thread(target=backward)\nt.start()\nt.join()",
}


@pytest.mark.parametrize("where", BACKWARD_ON)
def test_exit_right_after_backward_never_aborts(where):
    code = BACKWARD_THEN_EXIT + BACKWARD_ON[where]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda _: run_python(code, timeout=120), range(EXIT_RUNS)))
    failed = [(r.returncode, r.stderr[-300:]) for r in runs if r.returncode != 0]
    assert failed == [], f"{len(failed)} of {EXIT_RUNS} runs failed at exit: {failed[:3]}"


def _in_child(body):
    """Runs body() in a forked child; returns the child's exit status
    (0: body returned; 1: it raised; None: it hung for 60 s and was killed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException as e:  # noqa: BLE001
            print(f"child failed: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_child_that_exits_normally_keeps_the_parents_snapshots(plugin_file):
    """A forked child that exits through the interpreter's normal exit runs
    static destructors: it must not remove the parent's snapshot directory,
    and it gets a directory of its own when it loads plugins. (The parent is
    a small interpreter: forking pytest would run its exit machinery twice.)"""
    done = run_python(f"""
import os, sys, max_device
max_device.load_plugin({plugin_file("reference")!r})
parent_dir = max_device._C._snapshot_directory()
pid = os.fork()
if pid == 0:
    max_device.load_plugin({plugin_file("reference_v2")!r}, name="child_v2")
    assert max_device._C._snapshot_directory() != parent_dir
    sys.exit(0)  # the interpreter's normal exit: atexit handlers, static destructors
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert os.path.isdir(parent_dir), "the child removed the parent's snapshot directory"
max_device.load_plugin({plugin_file("reference_v2")!r}, name="parent_v2")
print("ok")
""", timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_fork_while_a_thread_is_inside_a_kernel(load_plugin, plugin_file):
    """A thread is inside a call (a Python override waiting on an event)
    when the process forks: the child can still reload and unload plugins
    (it would wait forever for a reader that does not exist there)."""
    plugin = load_plugin(plugin_file("reference"))
    entered, release = threading.Event(), threading.Event()

    def slow_relu(x):
        entered.set()
        release.wait(30)
        return NotImplemented

    x = torch.randn(8, device=DEVICE)
    with max_device.override("aten::relu", slow_relu):
        caller = threading.Thread(target=torch.relu, args=(x,))
        caller.start()
        assert entered.wait(30)

        def child():
            max_device.reload_plugin(plugin, force=True)
            max_device.unload_plugin(plugin.name)

        status = _in_child(child)
        release.set()
        caller.join(30)
    assert status == 0, "the child hung (None) or failed"
    assert plugin.loaded and plugin.generation == 1  # the parent is untouched


def test_a_watch_in_a_forked_child_stops_without_hanging(tmp_path, load_plugin, plugin_file):
    path = tmp_path / "libreference.so"
    path.write_bytes(open(plugin_file("reference"), "rb").read())
    load_plugin(str(path))
    with max_device.watch(tmp_path) as w:
        assert _in_child(w.stop) == 0
    assert w.events() == []
