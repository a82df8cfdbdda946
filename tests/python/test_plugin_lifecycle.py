"""Load, layer, unload: provider stacks, names, snapshots and Plugin state."""

import hashlib
import os
import time

import pytest
import torch

import max_device
from conftest import op_stats

DEVICE = "max_device"


def _layers(op):
    for e in max_device.list_ops():
        if e["op"] == op and not e.get("via"):
            return [l["owner"] for l in e["layers"]]
    return None


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_unload_returns_ops_to_fallback(load_plugin, plugin_file):
    plugin = load_plugin(plugin_file("reference"))
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.relu(x.to(DEVICE)).cpu(), torch.relu(x))
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    assert op_stats("aten::relu")[0] == 1 and op_stats("aten::neg.out")[0] == 1
    assert "aten::neg.out" not in max_device.fallback_counts()

    report = max_device.unload_plugin(plugin)
    assert report == {"name": "reference", "unmapped": True}
    assert max_device.list_ops() == []
    assert max_device.list_plugins() == []
    max_device.reset_fallback_counts()
    torch.testing.assert_close(torch.relu(x.to(DEVICE)).cpu(), torch.relu(x))
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    torch.testing.assert_close((x.to(DEVICE) + x.to(DEVICE)).cpu(), x + x)
    counts = max_device.fallback_counts()
    assert counts.get("aten::neg.out") == 1
    assert counts.get("aten::add.out") == 1
    assert counts.get("aten::relu", 0) + counts.get("aten::clamp_min.out", 0) >= 1, counts


def test_layering_and_unloading_the_top(load_plugin, fixture_file):
    a = load_plugin(fixture_file("good"))
    b = load_plugin(fixture_file("good_copy"))
    assert _layers("aten::neg.out") == ["good@1.0.0", "good_copy@1.0.0"]
    x = torch.randn(6)
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    entry = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")
    assert [(l["owner"], l["calls"]) for l in entry["layers"]] == [("good@1.0.0", 0), ("good_copy@1.0.0", 1)]

    max_device.unload_plugin(b)
    assert _layers("aten::neg.out") == ["good@1.0.0"]
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    entry = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")
    assert [(l["owner"], l["calls"]) for l in entry["layers"]] == [("good@1.0.0", 1)]
    assert b.loaded is False and a.loaded is True


def test_unloading_the_bottom_keeps_the_top(load_plugin, fixture_file):
    a = load_plugin(fixture_file("good"))
    load_plugin(fixture_file("good_copy"))
    max_device.unload_plugin(a)
    assert _layers("aten::neg.out") == ["good_copy@1.0.0"]
    x = torch.randn(6)
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    assert op_stats("aten::neg.out")[0] == 1


def test_same_name_twice_is_a_state_error(load_plugin, fixture_file):
    path = fixture_file("good")
    load_plugin(path)
    ops_before = max_device.list_ops()
    with pytest.raises(max_device.PluginStateError) as info:
        load_plugin(path)
    assert "good" in str(info.value) and info.value.plugin == "good"
    assert max_device.list_ops() == ops_before
    assert [p.name for p in max_device.list_plugins()] == ["good"]


def test_name_option_loads_side_by_side(load_plugin, fixture_file):
    path = fixture_file("good")
    first = load_plugin(path, name="good_a")
    second = load_plugin(path, name="good_b")
    assert (first.name, second.name) == ("good_a", "good_b")
    assert first.sha256 == second.sha256
    assert first.snapshot != second.snapshot
    assert sorted(p.name for p in max_device.list_plugins()) == ["good_a", "good_b"]
    assert _layers("aten::neg.out") == ["good_a@1.0.0", "good_b@1.0.0"]
    with pytest.raises(max_device.PluginStateError):
        load_plugin(path, name="good_a")
    max_device.unload_plugin("good_b")
    assert first.loaded and not second.loaded
    assert _layers("aten::neg.out") == ["good_a@1.0.0"]


def test_invalid_name_option_refused(load_plugin, fixture_file):
    with pytest.raises(max_device.PluginError):
        load_plugin(fixture_file("good"), name="not a valid name!")
    assert max_device.list_plugins() == []


def test_list_plugins_fields(load_plugin, plugin_file):
    path = plugin_file("reference")
    plugin = load_plugin(path)
    (listed,) = max_device.list_plugins()
    for p in (plugin, listed, max_device.get_plugin("reference")):
        assert p.name == "reference"
        assert p.version == "1.0.0"
        assert p.abi == "1.4"
        assert p.path == path
        assert p.sha256 == _sha256(path)
        assert os.path.isfile(p.snapshot) and os.path.realpath(p.snapshot) != os.path.realpath(path)
        assert _sha256(p.snapshot) == p.sha256
        assert "aten::add.out" in p.ops and "reference::version" in p.ops
        assert p.defines == ["reference::version"]
        assert p.loaded
    assert "reference" in repr(plugin) and "unloaded" not in repr(plugin)

    snapshot = plugin.snapshot
    plugin.unload()
    assert not os.path.exists(snapshot)
    assert plugin.loaded is False and listed.loaded is False
    assert "unloaded" in repr(plugin)
    assert max_device.list_plugins() == []
    with pytest.raises(max_device.PluginStateError):
        max_device.get_plugin("reference")


def test_snapshot_isolates_from_the_file(load_plugin, plugin_file, tmp_path):
    """The loaded image is the private snapshot: the user's file may be
    replaced or deleted while the plugin stays loaded and working."""
    path = tmp_path / "libreference.so"
    path.write_bytes(open(plugin_file("reference"), "rb").read())
    plugin = load_plugin(str(path))
    path.unlink()
    x = torch.randn(5)
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    assert op_stats("aten::neg.out")[0] == 1
    assert os.path.isfile(plugin.snapshot)


def test_unload_unknown_or_twice(load_plugin, fixture_file):
    plugin = load_plugin(fixture_file("good"))
    with pytest.raises(max_device.PluginStateError):
        max_device.unload_plugin("no_such_plugin")
    max_device.unload_plugin(plugin)
    with pytest.raises(max_device.PluginStateError):
        max_device.unload_plugin(plugin)
    with pytest.raises(TypeError):
        max_device.unload_plugin(42)


def test_reload_after_unload_counts_from_zero(load_plugin, fixture_file):
    path = fixture_file("good")
    x = torch.randn(4).to(DEVICE)
    plugin = load_plugin(path)
    torch.neg(x)
    assert op_stats("aten::neg.out")[0] == 1
    max_device.unload_plugin(plugin)
    again = load_plugin(path)
    # A handle names one load: the old one stays unloaded, and cannot reach the new load.
    assert again.loaded and not plugin.loaded and again != plugin
    with pytest.raises(max_device.PluginStateError, match="later load"):
        max_device.unload_plugin(plugin)
    assert again.loaded
    assert op_stats("aten::neg.out")[:2] == (0, 0)


def test_hot_swap_reference_v1_v2(load_plugin, plugin_file):
    x = torch.randn(3, device=DEVICE)
    v1 = load_plugin(plugin_file("reference"))
    assert torch.equal(torch.ops.reference.version(x).cpu(), torch.full((3,), 1.0))
    v2 = load_plugin(plugin_file("reference_v2"), name="reference_v2")
    assert v2.version == "2.0.0"
    assert torch.equal(torch.ops.reference.version(x).cpu(), torch.full((3,), 2.0))
    max_device.unload_plugin(v2)
    assert torch.equal(torch.ops.reference.version(x).cpu(), torch.full((3,), 1.0))
    max_device.unload_plugin(v1)
    # The op stays defined (Python may hold it); a call names the unloaded plugin.
    with pytest.raises(max_device.PluginStateError, match="plugin 'reference'.*was unloaded"):
        torch.ops.reference.version(x)


def test_a_handle_follows_its_plugin_through_reloads(tmp_path, load_plugin, plugin_file):
    """A handle reads the live state of its load: after reload_plugin by
    name or a watch() reload it shows the version serving now."""
    path = tmp_path / "libreference.so"
    path.write_bytes(open(plugin_file("reference"), "rb").read())
    handle = load_plugin(str(path))
    path.write_bytes(open(plugin_file("reference_v2"), "rb").read())
    max_device.reload_plugin("reference")
    assert (handle.version, handle.generation, handle.loaded) == ("2.0.0", 2, True)
    with max_device.watch(path, debounce=0.02) as w:
        tmp = tmp_path / "next.tmp"
        tmp.write_bytes(open(plugin_file("reference"), "rb").read())
        os.replace(tmp, path)
        deadline = time.monotonic() + 10
        while not w.events() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert (handle.version, handle.generation) == ("1.0.0", 3)
    assert handle == max_device.get_plugin("reference") and handle.path == str(path)
    handle.unload()
    assert not handle.loaded and handle.version == "1.0.0"  # the last state seen
    with pytest.raises(max_device.PluginStateError, match="unloaded"):
        handle.reload()
