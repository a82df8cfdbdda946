"""The snapshot directory is private to the user, removed at exit, and
snapshots left by processes that died without cleaning up are removed by
the next process that takes one."""

import os
import signal
import stat
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, run_python

# Loads a plugin, prints its snapshot directory, then dies or waits.
LOAD_AND = """
import os, signal, sys, max_device
plugin = max_device.load_plugin(sys.argv[1])
print(max_device._C._snapshot_directory(), flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""
FIRST_USE = "import max_device; print(max_device._C._snapshot_directory())"


@pytest.fixture
def snapshot_base(tmp_path):
    base = tmp_path / "snapshots"
    base.mkdir()
    return {"MAX_DEVICE_SNAPSHOT_DIR": str(base)}


def test_snapshot_of_a_killed_process_is_removed_by_the_next_one(snapshot_base, plugin_file):
    killed = run_python(LOAD_AND, env=snapshot_base, args=(plugin_file("reference"), "die"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    dead_dir = killed.stdout.strip()
    assert [f for f in os.listdir(dead_dir) if f.endswith(".so")], "the killed process left its snapshot"
    assert stat.S_IMODE(os.stat(dead_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(dead_dir)).st_mode) == 0o700

    unrelated = [os.path.join(os.path.dirname(dead_dir), name) for name in ("notes", "1-4194303")]
    for path in unrelated:  # not a directory of this pid namespace: cannot be judged, kept
        os.mkdir(path, 0o700)
    later = run_python(FIRST_USE, env=snapshot_base)
    assert later.returncode == 0, later.stderr
    assert not os.path.exists(dead_dir)
    assert all(os.path.isdir(p) for p in unrelated)
    assert not os.path.exists(later.stdout.strip()), "a process removes its own directory at exit"


def test_snapshot_of_a_live_process_is_kept_until_it_exits(snapshot_base, plugin_file):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, **snapshot_base)
    env.pop("MAX_DEVICE_LOG_LEVEL", None)
    live = subprocess.Popen([sys.executable, "-c", LOAD_AND, plugin_file("reference"), "wait"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        live_dir = live.stdout.readline().strip()
        assert run_python(FIRST_USE, env=snapshot_base).returncode == 0
        assert os.path.isdir(live_dir)
    finally:
        live.communicate("", timeout=60)  # end of stdin: it exits normally
    assert live.returncode == 0
    assert not os.path.exists(live_dir)
