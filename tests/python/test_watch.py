"""max_device.watch: the rebuilt file takes over, whoever wrote it."""

import os
import shutil
import time

import pytest
import torch

import max_device

DEVICE = "max_device"


def version():
    return torch.ops.reference.version(torch.zeros(2, device=DEVICE))[0].item()


def wait_for_events(watch, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(watch.events()) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return watch.events()


def write_in_place(source, target):  # a linker writing its output
    with open(source, "rb") as src, open(target, "r+b" if os.path.exists(target) else "wb") as dst:
        dst.truncate(0)
        dst.write(src.read())


def copy_over(source, target):  # cp
    shutil.copyfile(source, target)


def rename_into_place(source, target):  # build systems
    shutil.copyfile(source, str(target) + ".tmp")
    os.replace(str(target) + ".tmp", target)


@pytest.mark.parametrize("writer", [write_in_place, copy_over, rename_into_place])
def test_rebuilt_file_is_reloaded(tmp_path, plugin_file, load_plugin, writer):
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    plugin = load_plugin(path)
    with max_device.watch(tmp_path, debounce=0.05) as w:
        writer(plugin_file("reference_v2"), path)
        events = wait_for_events(w, 1)
    assert events and events[-1]["reloaded"], events
    assert version() == 2.0
    assert max_device.get_plugin(plugin.name).generation == 2


def test_half_written_file_is_never_loaded(tmp_path, plugin_file, load_plugin):
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    load_plugin(path)
    data = open(plugin_file("reference_v2"), "rb").read()
    with max_device.watch(path, debounce=0.05) as w:
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(0.5)  # ten debounce intervals with half a library on disk
            assert version() == 1.0 and w.events() == []
            f.write(data[len(data) // 2:])
        events = wait_for_events(w, 1)
    assert events[-1]["reloaded"] and version() == 2.0


def test_a_broken_build_is_reported_and_the_old_version_serves(tmp_path, plugin_file, load_plugin):
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    load_plugin(path)
    with max_device.watch(tmp_path, debounce=0.05) as w:
        (tmp_path / "junk").write_bytes(b"not a plugin")  # unrelated files are ignored
        path.write_bytes(b"\x7fELF" + b"\0" * 100)
        events = wait_for_events(w, 1)
    assert events and not events[-1]["reloaded"]
    assert version() == 1.0


def test_cli_watch_reports_a_reload(tmp_path, plugin_file):
    import subprocess
    import sys
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    child = subprocess.Popen([sys.executable, "-m", "max_device", "watch", str(path), "--debounce", "0.05",
                              "--seconds", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "watching 1 plugin" in child.stdout.readline()
        rename_into_place(plugin_file("reference_v2"), path)
        assert "reloaded: 1.0.0 -> 2.0.0" in child.stdout.readline()
    finally:
        child.kill()
        child.communicate()


def test_pattern_loads_new_matching_files_only(tmp_path, plugin_file):
    with max_device.watch(tmp_path, debounce=0.05, pattern="lib*.so") as w:
        rename_into_place(plugin_file("reference"), tmp_path / "notes.so")  # does not match
        rename_into_place(plugin_file("reference"), tmp_path / "libkernels.so")
        events = wait_for_events(w, 1)
        time.sleep(0.3)  # the non-matching file's debounce has long passed
        events = w.events()
    try:
        assert [e["file"] for e in events] == [str(tmp_path / "libkernels.so")], events
        assert events[0]["reloaded"] and events[0]["message"] == "loaded reference 1.0.0", events
        assert [os.path.realpath(p.path) for p in max_device.list_plugins()] == [str(tmp_path / "libkernels.so")]
        assert version() == 1.0
    finally:
        for p in max_device.list_plugins():
            max_device.unload_plugin(p.name)


@pytest.mark.parametrize("gate", ["preflight=True", "isolate=True"])
def test_a_watch_left_running_ends_with_the_interpreter(tmp_path, plugin_file, gate):
    from conftest import run_python
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    # The watch's thread calls Python: the interpreter's exit must end it,
    # even mid-reload (an isolated check takes seconds), without a crash or
    # a hang, and without publishing half a reload.
    code = f"""
import os, shutil, time, max_device
max_device.load_plugin({str(path)!r})
w = max_device.watch({str(tmp_path)!r}, debounce=0.0, {gate})
tmp = {str(path)!r} + ".tmp"
shutil.copyfile({plugin_file("reference_v2")!r}, tmp)
os.replace(tmp, {str(path)!r})
time.sleep(0.2)
print("exiting", flush=True)
"""
    for _ in range(2):
        result = run_python(code, timeout=60)
        assert result.returncode == 0 and result.stdout == "exiting\n", (result.returncode, result.stderr[-2000:])
