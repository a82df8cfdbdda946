"""The build rules of plugin_api/README.md, checked on every built plugin
with readelf: one exported symbol, no PyTorch dependency, no GNU unique
symbols. And the plugin built outside the tree from the installed SDK
loads and computes."""

import glob
import os
import shutil
import subprocess

import pytest
import torch

import max_device
from conftest import build_paths, op_stats

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf is not installed")


def _built_plugins():
    paths = build_paths()
    if paths is None:
        return []
    files = sorted(glob.glob(os.path.join(paths["plugins"], "*.so")))
    files += sorted(glob.glob(os.path.join(paths["fixtures"], "*.so")))
    files.append(os.path.join(paths["external_plugin"], "libhello.so"))
    return [pytest.param(f, id=os.path.basename(f)) for f in files]


def _readelf(*args):
    return subprocess.run(["readelf", *args], check=True, capture_output=True, text=True).stdout


def _symbols(text):
    """Rows of a readelf symbol table: (bind, visibility, ndx, name)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        # "Num: Value Size Type Bind Vis Ndx Name"
        if len(parts) >= 8 and parts[0].endswith(":") and parts[0][:-1].isdigit():
            rows.append((parts[4], parts[5], parts[6], parts[7].split("@", 1)[0]))
    return rows


@pytest.fixture(params=_built_plugins())
def plugin_so(request):
    if not os.path.isfile(request.param):
        pytest.skip(f"{request.param} is not built (run `ctest -R external` in the build dir)")
    return request.param


def test_exactly_one_exported_symbol(plugin_so):
    exported = [name for bind, vis, ndx, name in _symbols(_readelf("--dyn-syms", "-W", plugin_so))
                if ndx != "UND" and bind in ("GLOBAL", "WEAK", "UNIQUE") and vis in ("DEFAULT", "PROTECTED")]
    assert exported == ["maxdev_plugin_entry"]


def test_no_pytorch_dependency(plugin_so):
    dynamic = _readelf("-d", plugin_so)
    assert "Dynamic section" in dynamic, dynamic
    # (a C plugin that calls nothing from libc may need no library at all)
    needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert not [n for n in needed if n.startswith(("libtorch", "libc10", "libmax_device", "libpython"))], needed


def test_no_gnu_unique_symbols(plugin_so):
    symbols = _symbols(_readelf("-s", "-W", plugin_so))
    assert symbols, "no symbols: readelf output not understood"
    assert [name for bind, _, _, name in symbols if bind == "UNIQUE"] == []


def test_external_plugin_loads_and_computes(load_plugin, external_plugin_file):
    plugin = load_plugin(external_plugin_file)
    assert (plugin.name, plugin.ops) == ("hello", ["aten::neg.out"])
    x = torch.randn(3, 5)
    torch.testing.assert_close(torch.neg(x.to("max_device")).cpu(), -x)
    torch.testing.assert_close((-x.to("max_device")).cpu(), -x)
    assert op_stats("aten::neg.out")[:2] == (2, 0)
    # its declared capabilities: float64 and non-contiguous are declined
    torch.testing.assert_close(torch.neg(x.double().to("max_device")).cpu(), -x.double())
    torch.testing.assert_close(torch.neg(x.to("max_device").t()).cpu(), -x.t())
    assert op_stats("aten::neg.out")[:2] == (2, 2)
    assert max_device.unload_plugin(plugin)["unmapped"] is True
