"""The corpus of broken plugins and files: every way a load can fail.

Each case is loaded on a clean state, loaded with a good plugin serving
aten::neg.out, and loaded as a new version of that good plugin
(reload_plugin). Every one ends in the precise max_device.PluginError
subclass, with a message naming the file (and the plugin and op where there
is one), and leaves list_ops(), list_plugins() and the dispatcher's ops
exactly as they were; a call still works afterwards."""

import json
import os
import shutil
import subprocess
import sys
from typing import Callable, NamedTuple, Optional, Tuple

import pytest
import torch

import max_device
from conftest import PYTHON_DIR, run_python

DEVICE = "max_device"
EM_AARCH64 = 183
E_MACHINE_OFFSET = 18  # of the 2-byte e_machine field in an ELF header


def _state():
    """Everything a failed load must leave as it was."""
    return (list(max_device.list_ops()),
            [(p.name, p.sha256, p.generation) for p in max_device.list_plugins()],
            sorted(torch._C._dispatch_get_all_op_names()))


class Case(NamedTuple):
    make: Callable  # (tmp_path, plugin_file, fixture_file) -> path
    error: type
    detail: str  # a part of the message that says what is wrong
    plugin: Optional[str] = None  # named by a load (a reload always names the plugin it replaces)
    op: Optional[str] = None
    needs: Tuple[str, ...] = ()  # fixtures loaded first, for the whole test


def _fixture(name):
    return lambda tmp_path, plugin_file, fixture_file: fixture_file(name)


def _write(name, data):
    def make(tmp_path, plugin_file, fixture_file):
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)
    return make


def _truncated(tmp_path, plugin_file, fixture_file):
    data = open(plugin_file("reference"), "rb").read()
    path = tmp_path / "truncated.so"
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def _other_architecture(tmp_path, plugin_file, fixture_file):
    """A real plugin whose ELF header says AArch64."""
    data = bytearray(open(fixture_file("good"), "rb").read())
    data[E_MACHINE_OFFSET:E_MACHINE_OFFSET + 2] = EM_AARCH64.to_bytes(2, "little")
    path = tmp_path / "aarch64.so"
    path.write_bytes(bytes(data))
    return str(path)


def _libm(tmp_path, plugin_file, fixture_file):
    for candidate in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                      "/lib64/libm.so.6"):
        if os.path.isfile(candidate):
            return candidate
    pytest.skip("no libm.so.6 found")


def _after_inspect(change):
    """A good plugin's copy that inspect() reads, then `change(path)`
    deletes or replaces before the load."""
    def make(tmp_path, plugin_file, fixture_file):
        path = tmp_path / "changing.so"
        shutil.copyfile(fixture_file("good_copy"), path)
        assert max_device.inspect(str(path)).name == "good_copy"
        change(path)
        return str(path)
    return make


def _replace_with_text(path):
    replacement = path.with_suffix(".new")
    replacement.write_bytes(b"not a shared library\n")
    os.replace(replacement, path)


CASES = {
    # files that are no plugin at all
    "missing file": Case(lambda t, p, f: str(t / "missing.so"), max_device.PluginNotFoundError, "No such file"),
    "directory": Case(lambda t, p, f: str(t), max_device.PluginNotFoundError, "directory"),
    "empty file": Case(_write("empty.so", b""), max_device.BadImageError, "ELF"),
    "not ELF": Case(_write("text.so", b"not a shared library\n" * 10), max_device.BadImageError, "not an ELF"),
    "truncated ELF": Case(_truncated, max_device.BadImageError, "truncated"),
    "ELF for another architecture": Case(_other_architecture, max_device.BadImageError,
                                         f"another architecture (machine {EM_AARCH64})"),
    "deleted after inspect": Case(_after_inspect(os.remove), max_device.PluginNotFoundError, "No such file"),
    "replaced after inspect": Case(_after_inspect(_replace_with_text), max_device.BadImageError, "not an ELF"),
    # the manifest
    "manifest missing (libm)": Case(_libm, max_device.ManifestError, "no .maxdev_manifest section"),
    "manifest missing": Case(_fixture("raw_no_manifest"), max_device.ManifestError, "no .maxdev_manifest section"),
    "manifest corrupt": Case(_fixture("raw_corrupt_manifest"), max_device.ManifestError, "corrupt manifest record"),
    "manifest name not UTF-8": Case(_fixture("raw_non_utf8_manifest"), max_device.ManifestError,
                                    "plugin name is not UTF-8"),
    "manifest disagrees with the entry point": Case(_fixture("raw_version_disagrees"), max_device.ManifestError,
                                                    "disagree on the version ('1.0.0' vs '2.0.0')", "raw"),
    "definition name not UTF-8": Case(_fixture("raw_non_utf8_name"), max_device.ManifestError,
                                      r"disagree on the plugin name ('raw' vs 'raw\xff')", "raw"),
    # the entry point and the definition it returns
    "no entry point": Case(_fixture("rule_breaking/raw_no_entry"), max_device.BadImageError,
                           "does not export the entry point maxdev_plugin_entry"),
    "entry point returns an error": Case(_fixture("raw_entry_error"), max_device.BadImageError,
                                         "refused this host (status 2)", "raw"),
    "entry point returns no definition": Case(_fixture("raw_null_definition"), max_device.BadImageError,
                                              "returned no plugin definition", "raw"),
    # another major: refused from the manifest, before any plugin code runs
    "ABI major differs": Case(_fixture("abi_major_other"), max_device.AbiMismatchError, "ABI 2."),
    "ABI minor newer than the host": Case(_fixture("abi_minor_newer"), max_device.AbiMismatchError,
                                          "is newer than this max_device's ABI", "abi_minor_newer"),
    "plugin definition too small": Case(_fixture("raw_def_too_small"), max_device.AbiMismatchError,
                                        "plugin definition is 32 bytes", "raw"),
    "kernel definition too small": Case(_fixture("raw_kernel_def_too_small"), max_device.AbiMismatchError,
                                        "kernel definition 0 is 16 bytes", "raw"),
    "null plugin name": Case(_fixture("raw_null_name"), max_device.BadImageError, "plugin name is NULL", "raw"),
    "null kernel table": Case(_fixture("raw_null_kernels"), max_device.BadImageError, "kernels == NULL", "raw"),
    "null kernel function": Case(_fixture("raw_null_kernel_fn"), max_device.BadImageError,
                                 "kernel function is NULL", "raw", "aten::neg.out"),
    # ops and schemas
    "duplicate op": Case(_fixture("duplicate_op"), max_device.ManifestError, "lists this op twice",
                         "duplicate_op", "aten::neg.out"),
    "unknown aten op": Case(_fixture("unknown_op_last"), max_device.SchemaError, "definitely_not_an_op",
                            "unknown_op_last", "aten::definitely_not_an_op"),
    "malformed schema": Case(_fixture("malformed_schema"), max_device.SchemaError, "malformed schema",
                             "malformed_schema", "fixture_ns::broken"),
    "schema contradicts its aten op": Case(_fixture("contradicting_schema"), max_device.SchemaError,
                                           "contradicts the registered schema", "contradicting_schema",
                                           "aten::neg.out"),
    "custom op redefined with another schema": Case(_fixture("custom_op_changed"), max_device.SchemaError,
                                                    "defined by plugin 'custom_op'", "custom_op_changed",
                                                    "fixture_ns::negate.out", needs=("custom_op",)),
    "namespace of PyTorch": Case(_fixture("reserved_namespace"), max_device.SchemaError,
                                 "namespace 'prims' belongs to PyTorch", "reserved_namespace",
                                 "prims::fixture_negate"),
}


def _load_good(load_plugin, fixture_file):
    return load_plugin(fixture_file("good"))


SCENARIOS = {
    "load, nothing loaded": None,
    "load over a good plugin": _load_good,
    "reload of a good plugin": _load_good,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("case", list(CASES))
def test_broken_plugin_changes_nothing(case, scenario, load_plugin, tmp_path, plugin_file, fixture_file):
    c = CASES[case]
    for name in c.needs:
        load_plugin(fixture_file(name))
    good = SCENARIOS[scenario](load_plugin, fixture_file) if SCENARIOS[scenario] else None
    path = c.make(tmp_path, plugin_file, fixture_file)
    before = _state()

    with pytest.raises(c.error) as info:
        if scenario.startswith("reload"):
            max_device.reload_plugin(good.name, path)
        else:
            load_plugin(path)

    e = info.value
    assert type(e) is c.error, f"{type(e).__name__}: {e}"
    assert isinstance(e, max_device.PluginError)
    assert c.detail in str(e)
    assert e.file == path and f"({path})" in str(e)
    plugin = "good" if scenario.startswith("reload") else c.plugin
    assert e.plugin == plugin
    if plugin is not None:
        assert f"plugin '{plugin}'" in str(e)
    assert e.op == c.op
    if c.op is not None:
        assert f"op {c.op}" in str(e)
    assert _state() == before

    x = torch.randn(4)
    torch.testing.assert_close(torch.neg(x.to(DEVICE), out=torch.empty(4, device=DEVICE)).cpu(), -x)
    neg = [[l["owner"] for l in entry["layers"]] for entry in max_device.list_ops() if entry["op"] == "aten::neg.out"]
    assert neg == ([] if good is None else [["good@1.0.0"]])


# Cases found in the file and its manifest alone, before any plugin code runs.
FOUND_BY_INSPECT = ["missing file", "directory", "empty file", "not ELF", "truncated ELF",
                    "ELF for another architecture", "deleted after inspect", "replaced after inspect",
                    "manifest missing (libm)", "manifest missing", "manifest corrupt", "manifest name not UTF-8",
                    "no entry point", "ABI major differs"]


@pytest.mark.parametrize("case", FOUND_BY_INSPECT)
def test_inspect_refuses_what_is_no_plugin_file(case, tmp_path, plugin_file, fixture_file):
    """inspect refuses these too, with the same class."""
    c = CASES[case]
    path = c.make(tmp_path, plugin_file, fixture_file)
    with pytest.raises(c.error) as info:
        max_device.inspect(path)
    assert path in str(info.value)


@pytest.mark.parametrize("case, kernels", [("abi_minor_newer", 1), ("duplicate_op", 2),
                                           ("unknown_op_last", 2), ("raw_null_kernel_fn", 1)])
def test_inspect_shows_what_load_refuses(case, kernels, fixture_file):
    """The manifest of these is readable; only loading refuses them."""
    m = max_device.inspect(fixture_file(case))
    assert len(m.kernels) == kernels
    assert max_device.list_plugins() == []


def test_not_found_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        max_device.load_plugin(str(tmp_path / "nope.so"))


UNREADABLE_CODE = """
import json, sys, max_device
try:
    max_device.load_plugin(sys.argv[1])
except max_device.PluginError as e:
    print(json.dumps([type(e).__name__, str(e), e.file, e.plugin, e.op, len(max_device.list_plugins())]))
"""


def test_unreadable_file(fixture_file, tmp_path):
    """Root reads any file: the load runs in a child process without the
    capabilities that bypass file permissions, on a file of mode 000."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux)")
    path = str(tmp_path / "unreadable.so")
    shutil.copyfile(fixture_file("good"), path)
    os.chmod(path, 0)
    without_bypass = "-dac_override,-dac_read_search"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAX_DEVICE_")}
    env["PYTHONPATH"] = PYTHON_DIR
    result = subprocess.run(["setpriv", f"--inh-caps={without_bypass}", f"--bounding-set={without_bypass}",
                             sys.executable, "-c", UNREADABLE_CODE, path],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    kind, message, file, plugin, op, loaded = json.loads(result.stdout)
    assert kind == "PluginNotFoundError" and "Permission denied" in message, message
    assert (file, plugin, op, loaded) == (path, None, None, 0)


@pytest.mark.parametrize("fixture", ["abort_in_constructor", "constructor_throws"])
def test_constructor_that_kills_the_process(fixture, fixture_file):
    """inspect never runs the plugin's constructors; load_plugin(isolate=True)
    opens the library in a child process first and refuses it while this
    process lives."""
    path = fixture_file(fixture)
    assert max_device.inspect(path).name == fixture
    before = _state()
    with pytest.raises(max_device.ValidationError) as info:
        max_device.load_plugin(path, isolate=True)
    e = info.value
    assert (e.file, e.plugin) == (path, fixture)
    assert path in str(e)
    assert "crashed with SIGABRT" in str(e)
    assert _state() == before


@pytest.mark.parametrize("fixture", ["abort_in_constructor", "constructor_throws"])
def test_loading_without_isolation_runs_constructors(fixture, fixture_file):
    """What the docs warn about: without isolate=True the constructor runs in
    the loading process (here a child, which it kills)."""
    result = run_python("import sys, max_device; max_device.load_plugin(sys.argv[1])",
                        args=(fixture_file(fixture),))
    # An exception thrown by a static constructor escapes from inside dlopen:
    # the loader lets it end the process (std::terminate) rather than unwind
    # glibc's frames.
    assert result.returncode == -6, result.stderr  # SIGABRT


TRACE_CODE = """
import sys, max_device
path, action = sys.argv[1], sys.argv[2]
if action == "inspect":
    print(max_device.inspect(path).name)
else:
    p = max_device.load_plugin(path)
    print(p.name)
    p.unload()
"""


@pytest.mark.parametrize("action, constructed", [("inspect", False), ("load", True)])
def test_inspect_runs_no_plugin_code(action, constructed, fixture_file, tmp_path):
    trace = tmp_path / "trace.txt"
    result = run_python(TRACE_CODE, env={"MAXDEV_FIXTURE_TRACE": str(trace)},
                        args=(fixture_file("traced"), action))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "traced"
    if constructed:
        assert trace.read_text() == "constructed\n"
    else:
        assert not trace.exists()


def test_name_clash_refused_before_plugin_code_runs(fixture_file, tmp_path):
    """Loading traced twice under one name runs its constructor once: the
    second load is refused before its snapshot is mapped."""
    trace = tmp_path / "trace.txt"
    code = """
import sys, max_device
p = max_device.load_plugin(sys.argv[1])
try:
    max_device.load_plugin(sys.argv[1])
except max_device.PluginStateError:
    print("refused")
p.unload()
"""
    result = run_python(code, env={"MAXDEV_FIXTURE_TRACE": str(trace)}, args=(fixture_file("traced"),))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused"
    assert trace.read_text() == "constructed\n"
