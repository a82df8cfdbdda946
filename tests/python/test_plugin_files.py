"""What the loader does with files and paths that are not ordinary: FIFOs,
unusable snapshot directories (missing, read-only, full, noexec), plugins
on noexec mounts, paths with NUL or non-UTF-8 bytes, huge files that are
not plugins, and arguments out of range. Each ends in a clear, typed error
at once, or works."""

import contextlib
import os
import pathlib
import resource
import shutil
import subprocess

import pytest

import max_device
from conftest import run_python


@contextlib.contextmanager
def tmpfs(path, options):
    """A small tmpfs mounted at `path` (root only: skipped otherwise)."""
    os.makedirs(path, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield pathlib.Path(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def run_and_report(code, env=None):
    """Runs `code` in a fresh interpreter; returns (type name, message) of
    what it raised, or ("ok", ...) — within 60 s, or the test fails."""
    done = run_python(f"""
import max_device
try:
{chr(10).join('    ' + line for line in code.strip().splitlines())}
    print("ok")
except Exception as e:
    print(type(e).__name__)
    print(e)
""", env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, _, message = done.stdout.partition("\n")
    return kind, message


def test_a_fifo_is_refused_at_once_everywhere(tmp_path):
    fifo = str(tmp_path / "libfifo.so")
    os.mkfifo(fifo)
    for call in (f"max_device.inspect({fifo!r})", f"max_device.load_plugin({fifo!r})",
                 f"max_device.load_plugin({fifo!r}, validate=True)",
                 f"max_device.load_plugin({fifo!r}, isolate=True)",
                 f"max_device.load_plugin({fifo!r}, preflight=True)"):
        kind, message = run_and_report(call)
        assert kind == "PluginNotFoundError" and "not a regular file" in message and fifo in message, call


def test_a_missing_snapshot_base_directory(tmp_path, plugin_file):
    missing = str(tmp_path / "no" / "such")
    kind, message = run_and_report(f"max_device.load_plugin({plugin_file('reference')!r})",
                                   env={"MAX_DEVICE_SNAPSHOT_DIR": missing})
    assert kind == "SnapshotError" and missing in message and "does not exist" in message
    assert "MAX_DEVICE_SNAPSHOT_DIR" in message and plugin_file("reference") in message


@pytest.mark.parametrize("options, says", [("ro,size=1m", "Read-only file system"),
                                           ("size=64k", "No space left on device"),
                                           ("size=1m,noexec", "noexec")])
def test_an_unusable_snapshot_directory(tmp_path, plugin_file, options, says):
    with tmpfs(tmp_path / "mnt", options) as base:
        kind, message = run_and_report(f"max_device.load_plugin({plugin_file('reference')!r})",
                                       env={"MAX_DEVICE_SNAPSHOT_DIR": str(base)})
    assert kind == "SnapshotError" and says in message and str(base) in message, message


def test_a_plugin_on_a_noexec_mount_needs_allow_untrusted(tmp_path, load_plugin, plugin_file):
    with tmpfs(tmp_path / "mnt", "size=4m,noexec,mode=0755") as mnt:
        path = str(mnt / "libreference.so")
        shutil.copyfile(plugin_file("reference"), path)
        with pytest.raises(max_device.UntrustedPluginError, match="noexec"):
            max_device.load_plugin(path)
        plugin = load_plugin(path, allow_untrusted=True)
        max_device.unload_plugin(plugin)


def test_paths_with_nul_or_non_utf8_bytes(tmp_path, load_plugin, plugin_file):
    with pytest.raises(ValueError, match="null byte"):
        max_device.load_plugin(plugin_file("reference") + "\0ignored")
    with pytest.raises(ValueError, match="null byte"):
        max_device.inspect(plugin_file("reference").encode() + b"\0")
    directory = os.path.join(os.fsencode(tmp_path), b"caf\xe9-\xff")
    os.mkdir(directory)
    raw = os.path.join(directory, b"libreference.so")
    shutil.copyfile(plugin_file("reference"), raw)
    for path in (raw, os.fsdecode(raw), pathlib.Path(os.fsdecode(raw))):
        assert max_device.inspect(path).name == "reference"
        plugin = load_plugin(path)
        assert os.fsencode(plugin.path) == raw
        max_device.unload_plugin(plugin)
    with pytest.raises(max_device.PluginNotFoundError) as info:
        max_device.load_plugin(os.path.join(directory, b"missing.so"))
    assert os.fsencode(info.value.file) == os.path.join(directory, b"missing.so")


def test_a_huge_file_that_is_not_a_plugin_is_not_read(tmp_path):
    huge = tmp_path / "libhuge.so"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB of zeros
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(max_device.BadImageError, match="not an ELF file"):
        max_device.inspect(huge)
    with pytest.raises(max_device.BadImageError, match="not an ELF file"):
        max_device.load_plugin(huge)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KiB


@pytest.mark.parametrize("call, error, says", [
    (lambda p, d: max_device.watch(d, debounce=-1), ValueError, "debounce"),
    (lambda p, d: max_device.watch(d, debounce=float("nan")), ValueError, "debounce"),
    (lambda p, d: max_device.watch(d, debounce=1e30), ValueError, "debounce"),
    (lambda p, d: max_device.watch(d, pattern="a/b"), ValueError, "pattern"),
    (lambda p, d: max_device.load_plugin(p, isolate=True, timeout=-1), ValueError, "timeout"),
    (lambda p, d: max_device.load_plugin(p, preflight=True, timeout=float("inf")), ValueError, "timeout"),
    (lambda p, d: max_device.load_plugin(p, name=""), ValueError, "name"),
    (lambda p, d: max_device.load_plugin(p, name=7), TypeError, "name"),
    (lambda p, d: max_device.load_plugin(p, sha256=123), TypeError, "sha256"),
    (lambda p, d: max_device.load_plugin(42), TypeError, "path"),
    (lambda p, d: max_device.set_fallback_policy("warn", op="aten::no_such_op"), ValueError, "aten::no_such_op"),
    (lambda p, d: max_device.set_fallback_policy("warn", op="aten::add.no_such"), ValueError, "aten::add.no_such"),
])
def test_arguments_out_of_range_are_refused(plugin_file, tmp_path, call, error, says):
    with pytest.raises(error, match=says):
        call(plugin_file("reference"), tmp_path)
    assert max_device.list_plugins() == []
