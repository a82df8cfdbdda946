"""list_ops() and its table, inspect() and Manifest, and the CLI
(python -m max_device inspect / ops / --cmake-dir / --include-dir)."""

import os

import pytest
import torch

import max_device
from conftest import run_python

CLI = "import runpy; runpy.run_module('max_device', run_name='__main__', alter_sys=True)"


def run_cli(*args):
    return run_python(CLI, args=args)


def test_table_header_and_rows(load_plugin, plugin_file):
    load_plugin(plugin_file("reference"))
    torch.randn(3, device="max_device") + 1
    table = max_device.list_ops()
    lines = str(table).splitlines()
    assert lines[0].split() == ["op", "active", "stack", "(bottom", "->", "top)", "calls", "declines",
                                "fallbacks"]
    add_out = next(l for l in lines if l.startswith("aten::add.out "))
    fallbacks = next(e for e in table if e["op"] == "aten::add.out")["fallbacks"]
    assert add_out.split() == ["aten::add.out", "reference@1.0.0", "reference@1.0.0", "1", "0", str(fallbacks)]
    assert any(l.startswith("aten::add.Tensor  (via aten::add.out)") for l in lines)
    assert any(l.startswith("aten::add_.Tensor  (via aten::add.out)") for l in lines)
    assert len(lines) == 1 + len(table)
    derived = [e for e in table if e["via"]]
    assert {"op": "aten::add.Tensor", "via": "aten::add.out"}.items() <= \
        next(e for e in derived if e["op"] == "aten::add.Tensor").items()
    # functional relu is not structured: its own row, no via
    relu = next(e for e in table if e["op"] == "aten::relu")
    assert relu["via"] is None and relu["layers"][0]["kind"] == "plugin"


def test_empty_table_is_just_the_header():
    assert list(max_device.list_ops()) == []
    assert str(max_device.list_ops()).split() == ["op", "active", "stack", "(bottom", "->", "top)",
                                                  "calls", "declines", "fallbacks"]


def test_list_ops_filters_by_plugin(load_plugin, plugin_file, fixture_file):
    reference = load_plugin(plugin_file("reference"))
    sdk = load_plugin(plugin_file("sdk_example"))
    good = load_plugin(fixture_file("good"))
    by_sdk = {e["op"] for e in max_device.list_ops(sdk)}
    assert by_sdk == {"myplug::rms_norm", "myplug::swiglu", "myplug::swiglu_backward", "aten::silu.out",
                      "aten::silu", "aten::silu_"}
    by_name = {e["op"] for e in max_device.list_ops("sdk_example")}
    assert by_name == by_sdk
    by_good = [e for e in max_device.list_ops(good) if not e["via"]]
    assert [e["op"] for e in by_good] == ["aten::neg.out"]
    # the stack still shows every provider of the op
    assert [l["owner"] for l in by_good[0]["layers"]] == ["reference@1.0.0", "good@1.0.0"]
    both = {e["op"] for e in max_device.list_ops(sdk, good)}
    assert both == by_sdk | {e["op"] for e in max_device.list_ops(good)}
    everything = {e["op"] for e in max_device.list_ops()}
    assert everything == {e["op"] for e in max_device.list_ops(reference)} | by_sdk
    assert max_device.list_ops("no_such_plugin") == []


def test_inspect_fields_and_str(plugin_file):
    m = max_device.inspect(plugin_file("sdk_example"))
    assert isinstance(m, max_device.Manifest)
    assert (m.name, m.version, m.abi) == ("sdk_example", "1.0.0", "1.4")
    assert m.exported_symbols == ["maxdev_plugin_entry"]
    assert [k.op for k in m.kernels] == ["myplug::rms_norm", "myplug::swiglu", "myplug::swiglu_backward",
                                         "aten::silu.out"]
    rms, swiglu, _, silu = m.kernels
    assert rms.schema == "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"
    assert silu.schema == ""
    assert rms.dtypes != 0 and silu.dtypes == rms.dtypes != swiglu.dtypes  # float32; float32 | float64
    assert rms.flags != 0
    text = str(m)
    assert text.splitlines()[0] == "sdk_example 1.0.0 (plugin ABI 1.4), 4 kernels"
    # each kernel's declared dtypes and flags
    assert ("  myplug::rms_norm  [float32; contiguous_only,no_cpu_tensors]  defines: "
            "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor") in text
    assert "  aten::silu.out  [float32; contiguous_only,no_cpu_tensors]" in text.splitlines()
    assert "  myplug::swiglu  [float32,float64; no_cpu_tensors]  defines: " \
        "myplug::swiglu(Tensor gate, Tensor up) -> Tensor" in text
    assert max_device.list_plugins() == []  # inspect loads nothing


def test_cli_inspect(plugin_file):
    result = run_cli("inspect", plugin_file("reference"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("reference 1.0.0 (plugin ABI 1.4), 22 kernels")
    for op in ("aten::add.out", "aten::mm.out", "reference::version"):
        assert f"  {op}" in out


def test_cli_inspect_bad_file(tmp_path):
    bad = tmp_path / "bad.so"
    bad.write_text("not a plugin")
    result = run_cli("inspect", str(bad))
    assert result.returncode == 1
    assert "BadImageError" in result.stderr and str(bad) in result.stderr
    assert result.stdout == ""


def test_cli_ops(plugin_file, fixture_file):
    result = run_cli("ops", plugin_file("sdk_example"), fixture_file("good"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["op", "active"]
    assert any(l.split()[:3] == ["myplug::rms_norm", "sdk_example@1.0.0", "sdk_example@1.0.0"] for l in lines)
    assert any(l.startswith("aten::silu  (via aten::silu.out)") for l in lines)
    assert any(l.split()[:2] == ["aten::neg.out", "good@1.0.0"] for l in lines)


def test_cli_ops_bad_plugin(fixture_file):
    result = run_cli("ops", fixture_file("abi_major_other"))
    assert result.returncode == 1
    assert "AbiMismatchError" in result.stderr


def test_cli_sdk_dirs():
    result = run_python(
        "import sys, runpy\n"
        "for flag in ('--cmake-dir', '--include-dir'):\n"
        "    sys.argv = ['max_device', flag]\n"
        "    try:\n"
        "        runpy.run_module('max_device', run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n")
    assert result.returncode == 0, result.stderr
    cmake_dir, include_dir = result.stdout.splitlines()
    assert os.path.isfile(os.path.join(cmake_dir, "MaxDevicePluginConfig.cmake"))
    assert os.path.isfile(os.path.join(include_dir, "max_device", "plugin.h"))
    assert os.path.isfile(os.path.join(include_dir, "max_device", "plugin.hpp"))


def test_counters_add_up_over_reloads_and_rollback(tmp_path, load_plugin, plugin_file):
    """calls/declines: since the plugin was loaded, over all its versions;
    version_calls/version_declines: the serving version since it became
    current. A reload or a rollback resets neither total."""
    path = tmp_path / "libreference.so"
    path.write_bytes(open(plugin_file("reference"), "rb").read())
    plugin = load_plugin(str(path))
    x = torch.randn(8, device="max_device")

    def relu_layer():
        (entry,) = [e for e in max_device.list_ops() if e["op"] == "aten::relu"]
        (layer,) = entry["layers"]
        return layer["calls"], layer["version_calls"]

    for _ in range(3):
        torch.relu(x)
    assert relu_layer() == (3, 3)
    plugin.reload(plugin_file("reference_v2"))
    assert relu_layer() == (3, 0)
    torch.relu(x)
    assert relu_layer() == (4, 1)
    plugin.rollback()
    assert relu_layer() == (4, 0)
    torch.relu(x)
    assert relu_layer() == (5, 1)
    assert "5" in next(line for line in str(max_device.list_ops()).splitlines() if line.startswith("aten::relu "))
