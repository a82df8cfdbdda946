"""Every way a load can fail: the precise error class, a message naming the
file (and plugin/op where there is one), and no observable change."""

import os

import pytest
import torch

import max_device
from conftest import op_stats, run_python

DEVICE = "max_device"


def _state():
    """Everything a failed load must leave as it was."""
    return (list(max_device.list_ops()),
            [(p.name, p.sha256) for p in max_device.list_plugins()],
            hasattr(torch.ops.aten, "definitely_not_an_op"),
            hasattr(torch.ops, "fixture_ns") and hasattr(torch.ops.fixture_ns, "negate"))


def _truncated(tmp_path, plugin_file, fixture_file):
    data = open(plugin_file("reference"), "rb").read()
    path = tmp_path / "truncated.so"
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def _libm(tmp_path, plugin_file, fixture_file):
    for candidate in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                      "/lib64/libm.so.6"):
        if os.path.isfile(candidate):
            return candidate
    pytest.skip("no libm.so.6 found")


def _write(name, data):
    def make(tmp_path, plugin_file, fixture_file):
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)
    return make


# id -> (make(tmp_path, plugin_file, fixture_file) -> path, error class,
#        plugin named, op named)
LOAD_ERRORS = {
    "missing file": (lambda t, p, f: str(t / "missing.so"), max_device.PluginNotFoundError, None, None),
    "directory": (lambda t, p, f: str(t), max_device.PluginNotFoundError, None, None),
    "empty file": (_write("empty.so", b""), max_device.BadImageError, None, None),
    "not ELF": (_write("text.so", b"not a shared library\n" * 10), max_device.BadImageError, None, None),
    "truncated": (_truncated, max_device.BadImageError, None, None),
    "libm (no manifest)": (_libm, max_device.ManifestError, None, None),
    "abi_minor_newer": (lambda t, p, f: f("abi_minor_newer"), max_device.AbiMismatchError,
                        "abi_minor_newer", None),
    # another major: refused before anything past the frozen fields is read
    "abi_major_other": (lambda t, p, f: f("abi_major_other"), max_device.AbiMismatchError, None, None),
    "duplicate_op": (lambda t, p, f: f("duplicate_op"), max_device.ManifestError,
                     "duplicate_op", "aten::neg.out"),
    "unknown_op_last": (lambda t, p, f: f("unknown_op_last"), max_device.SchemaError,
                        "unknown_op_last", "aten::definitely_not_an_op"),
}


@pytest.fixture(params=["nothing loaded", "good loaded"])
def baseline(request, load_plugin, fixture_file):
    """Failed loads are checked against an empty state and against one with
    a plugin (serving aten::neg.out) loaded."""
    if request.param == "good loaded":
        load_plugin(fixture_file("good"))
    return request.param


@pytest.mark.parametrize("case", list(LOAD_ERRORS))
def test_load_error(case, baseline, load_plugin, tmp_path, plugin_file, fixture_file):
    make, error, plugin, op = LOAD_ERRORS[case]
    path = make(tmp_path, plugin_file, fixture_file)
    before = _state()
    with pytest.raises(error) as info:
        load_plugin(path)
    e = info.value
    assert type(e) is error, f"{type(e).__name__}: {e}"
    assert isinstance(e, max_device.PluginError) and isinstance(e, RuntimeError)
    assert path in str(e) and e.file == path
    if plugin is not None:
        assert f"'{plugin}'" in str(e) and e.plugin == plugin
    if op is not None:
        assert op in str(e) and e.op == op
    assert _state() == before

    x = torch.randn(4)
    neg_layers = [e["layers"] for e in max_device.list_ops() if e["op"] == "aten::neg.out"]
    if baseline == "nothing loaded":
        assert neg_layers == []  # e.g. unknown_op_last left no provider on neg.out
    else:
        assert [[l["owner"] for l in ls] for ls in neg_layers] == [["good@1.0.0"]]
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)


def test_not_found_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        max_device.load_plugin(str(tmp_path / "nope.so"))


@pytest.mark.parametrize("case", [c for c in LOAD_ERRORS if c not in ("abi_minor_newer", "duplicate_op",
                                                                      "unknown_op_last")])
def test_inspect_error(case, tmp_path, plugin_file, fixture_file):
    """inspect refuses what is not a plugin file at all, with the same class."""
    make, error, _, _ = LOAD_ERRORS[case]
    path = make(tmp_path, plugin_file, fixture_file)
    with pytest.raises(error) as info:
        max_device.inspect(path)
    assert path in str(info.value)


@pytest.mark.parametrize("case, kernels", [("abi_minor_newer", 1), ("duplicate_op", 2),
                                           ("unknown_op_last", 2)])
def test_inspect_shows_what_load_refuses(case, kernels, fixture_file):
    """The manifest of these is readable; only loading refuses them."""
    m = max_device.inspect(fixture_file(case))
    assert m.name == case and len(m.kernels) == kernels
    assert max_device.list_plugins() == []


def test_failing_kernel_raises_kernel_error_at_call(load_plugin, fixture_file):
    path = fixture_file("failing_kernel")
    load_plugin(path)
    before = _state()
    x = torch.randn(4, device=DEVICE)
    with pytest.raises(max_device.KernelError) as info:
        torch.neg(x)
    e = info.value
    assert type(e) is max_device.KernelError and isinstance(e, RuntimeError)
    assert (e.plugin, e.op, e.file) == ("failing_kernel", "aten::neg.out", path)
    for part in ("failing_kernel", "aten::neg.out", path, "fixture kernel failed on purpose"):
        assert part in str(e)
    calls, declines, fallbacks = op_stats("aten::neg.out")
    assert (calls, declines) == (1, 0)  # the failed call counts as a call, not a decline
    # an error is not a decline: nothing fell back, the plugin stays loaded
    assert "aten::neg.out" not in max_device.fallback_counts()
    assert [p.name for p in max_device.list_plugins()] == ["failing_kernel"]
    with pytest.raises(max_device.KernelError):
        torch.neg(x)
    assert _state()[1:] == before[1:]


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
