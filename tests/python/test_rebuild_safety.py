"""A plugin file that is still being written is never loaded, and a new
build that crashes while it is opened never takes the process down: for an
explicit reload/load and for watch(), whatever the writer (in place, a
presized out-of-order writer, a rename; ld.bfd through cmake is in
test_rebuild_stress.py)."""

import hashlib
import os
import shutil
import time

import pytest
import torch

import max_device

DEVICE = "max_device"


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def version():
    return torch.ops.reference.version(torch.zeros(2, device=DEVICE))[0].item()


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


class HeldWriter:
    """A writer that has written part of a file and still holds it open, as
    a linker does between its first byte and its close."""

    def __init__(self, target, data, written):
        self.data = data
        self.file = open(target, "r+b" if os.path.exists(target) else "wb")
        self.file.truncate(0)
        self.file.write(data[:written])
        self.file.flush()
        self.written = written

    def finish(self):
        self.file.write(self.data[self.written:])
        self.file.close()


@pytest.fixture
def v1_copy(tmp_path, plugin_file):
    path = tmp_path / "libkernels.so"
    shutil.copyfile(plugin_file("reference"), path)
    return str(path)


def test_reload_refuses_a_file_still_open_for_writing(v1_copy, load_plugin, plugin_file):
    plugin = load_plugin(v1_copy)
    v2 = open(plugin_file("reference_v2"), "rb").read()
    # Everything but the last bytes: it already parses as a complete plugin.
    writer = HeldWriter(v1_copy, v2, len(v2) - 64)
    try:
        with pytest.raises(max_device.PluginBusyError) as info:
            max_device.reload_plugin(plugin)
        assert f"pid {os.getpid()}" in str(info.value) and info.value.file == v1_copy
        assert plugin.version == "1.0.0" and version() == 1.0
    finally:
        writer.finish()
    max_device.reload_plugin(plugin)
    assert plugin.version == "2.0.0" and plugin.sha256 == sha256(plugin_file("reference_v2"))


def test_load_refuses_a_file_still_open_for_writing(tmp_path, plugin_file):
    path = str(tmp_path / "libnew.so")
    data = open(plugin_file("reference"), "rb").read()
    writer = HeldWriter(path, data, len(data) // 2)
    try:
        with pytest.raises(max_device.PluginBusyError, match="still being written"):
            max_device.load_plugin(path)
        assert max_device.list_plugins() == []
    finally:
        writer.finish()


def test_watch_waits_for_a_presized_out_of_order_writer(v1_copy, load_plugin, plugin_file):
    """The writer sizes the file first, writes its end, pauses for many
    debounce intervals with the file open, then writes the start: nothing
    is loaded until it closes the file, and then the finished build is."""
    plugin = load_plugin(v1_copy)
    v2 = open(plugin_file("reference_v2"), "rb").read()
    half = len(v2) // 2
    with max_device.watch(v1_copy, debounce=0.05) as w:
        with open(v1_copy, "r+b") as f:
            f.truncate(len(v2))
            f.seek(half)
            f.write(v2[half:])
            f.flush()
            time.sleep(0.4)
            assert w.events() == [] and version() == 1.0
            f.seek(0)
            f.write(v2[:half])
            f.flush()
            time.sleep(0.4)
            assert w.events() == [] and version() == 1.0
        assert wait_until(lambda: w.events())
    (event,) = w.events()
    assert event["reloaded"] and event["version"] == "2.0.0", event
    assert plugin.sha256 == sha256(plugin_file("reference_v2")) and version() == 2.0


def test_watch_ignores_files_that_are_not_plugins(tmp_path, v1_copy, load_plugin, capfd):
    """A build writes many files beside its plugins: they are ignored
    silently, a FIFO included (it is never opened, so stop() returns)."""
    load_plugin(v1_copy)
    with max_device.watch(tmp_path, debounce=0.02) as w:
        for name in ("CMakeCache.txt", "Makefile", ".ninja_log", ".ninja_deps", "libother.so.tmp"):
            (tmp_path / name).write_bytes(b"not a plugin\n" * 100)
        os.mkfifo(tmp_path / "pipe")
        time.sleep(0.3)
        started = time.monotonic()
    assert time.monotonic() - started < 5
    assert w.events() == []
    assert "[error]" not in capfd.readouterr().err


@pytest.mark.parametrize("broken", ["abort_in_constructor", "constructor_throws", "init_segfaults"])
def test_watch_refuses_a_build_that_crashes_when_opened(tmp_path, load_plugin, fixture_file, broken):
    """The pre-flight (a fork of this process) opens each new build first:
    a build that aborts, throws from a constructor or segfaults in init is
    refused, and the process and the current version go on."""
    path = tmp_path / "libfixture.so"
    shutil.copyfile(fixture_file("good"), path)
    plugin = load_plugin(str(path))
    with max_device.watch(tmp_path, debounce=0.02) as w:
        shutil.copyfile(fixture_file(broken), str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        assert wait_until(lambda: w.events())
    (event,) = w.events()
    assert not event["reloaded"] and "pre-flight" in event["message"], event
    assert plugin.generation == 1 and plugin.sha256 == sha256(fixture_file("good"))
    x = torch.randn(4)
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)


@pytest.mark.parametrize("broken, signal", [("abort_in_constructor", "SIGABRT"), ("init_segfaults", "SIGSEGV")])
def test_reload_with_preflight_refuses_a_crashing_build(v1_copy, load_plugin, fixture_file, broken, signal):
    plugin = load_plugin(v1_copy)
    with pytest.raises(max_device.ValidationError, match=f"crashed with {signal}"):
        max_device.reload_plugin(plugin, fixture_file(broken), preflight=True)
    assert plugin.version == "1.0.0" and version() == 1.0
    with pytest.raises(max_device.ValidationError, match="crashed with SIGABRT"):
        max_device.load_plugin(fixture_file("abort_in_constructor"), preflight=True)


def test_preflight_with_validate_checks_the_kernels_in_the_child(tmp_path, load_plugin, fixture_file):
    """With validate, the child runs the comparison too, even when this
    process has OpenMP worker threads (which the child does not have)."""
    big = torch.randn(512, 512)
    (big @ big).sum()
    path = tmp_path / "libfixture.so"
    shutil.copyfile(fixture_file("good"), path)
    plugin = load_plugin(str(path))
    with pytest.raises(max_device.ValidationError) as info:
        max_device.reload_plugin(plugin, fixture_file("wrong_kernel"), preflight=True, validate=True)
    assert info.value.report and info.value.report[0].op == "aten::neg.out"
    assert "aten::neg.out" in str(info.value) and "pre-flight" in str(info.value)
    assert plugin.generation == 1
    max_device.reload_plugin(plugin, fixture_file("good_copy"), preflight=True, validate=True)
    assert plugin.generation == 2
