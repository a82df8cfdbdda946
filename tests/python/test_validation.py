"""Checks before a version goes live: validate=True and isolate=True."""

import threading
import time

import pytest
import torch

import max_device

DEVICE = "max_device"


def neg_served_by():
    entry = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")
    return entry["layers"][-1]["owner"]


def test_a_wrong_kernel_is_refused_with_a_report_and_the_old_version_serves(load_plugin, fixture_file):
    plugin = load_plugin(fixture_file("good"), name="kernels", validate=True)
    with pytest.raises(max_device.ValidationError) as caught:
        plugin.reload(fixture_file("wrong_kernel"), validate=True)
    error = caught.value
    assert "wrong_kernel.so" in str(error) and "aten::neg.out" in str(error)
    assert error.report and error.report[0].op == "aten::neg.out"
    assert error.report[0].max_abs == pytest.approx(1.0)
    assert plugin.reload().generation == 1
    assert torch.neg(torch.ones(3, device=DEVICE)).tolist() == [-1.0] * 3


def test_a_wrong_kernel_is_not_loaded(fixture_file):
    with pytest.raises(max_device.ValidationError, match="disagree with the CPU"):
        max_device.load_plugin(fixture_file("wrong_kernel"), validate=True)
    assert max_device.list_plugins() == []


@pytest.mark.parametrize("fixture, signal_name", [("segfaulting_kernel", "SIGSEGV"),
                                                  ("abort_in_constructor", "SIGABRT")])
def test_a_crashing_version_is_refused_by_the_isolated_check(load_plugin, fixture_file, fixture, signal_name):
    plugin = load_plugin(fixture_file("good"), name="kernels")
    with pytest.raises(max_device.ValidationError, match=signal_name):
        plugin.reload(fixture_file(fixture), isolate=True, validate=True)
    assert neg_served_by() == "kernels@1.0.0"
    assert torch.neg(torch.ones(2, device=DEVICE)).tolist() == [-1.0, -1.0]


def test_isolated_load_of_a_good_plugin(load_plugin, fixture_file):
    plugin = load_plugin(fixture_file("good"), isolate=True, validate=True)
    assert plugin.generation == 1 and neg_served_by() == "good@1.0.0"


def test_a_check_may_list_state_but_not_start_another_change(load_plugin, fixture_file):
    """Checks run inside the change (the registry's lock held): listing
    plugins and ops from one works, a nested change is refused, not a
    deadlock. (A check is any callable; validate=True installs one.)"""
    load_plugin(fixture_file("good"))
    seen = {}

    def check(ops):
        seen["plugins"] = [p.name for p in max_device.list_plugins()]
        seen["ops"] = [e["op"] for e in max_device.list_ops() if not e["via"]]
        with pytest.raises(max_device.PluginStateError, match="inside a check of another change"):
            max_device.unload_plugin("good")
        seen["ops_in_check"] = ops

    info = max_device._C._load_plugin(fixture_file("good_copy"), None, before_publish=check)
    try:
        assert seen == {"plugins": ["good"], "ops": ["aten::neg.out"], "ops_in_check": ["aten::neg.out"]}
        assert [p.name for p in max_device.list_plugins()] == ["good", info["name"]]
    finally:
        max_device.unload_plugin(info["name"])


def test_a_refused_version_leaves_the_plugins_custom_ops_and_counters(load_plugin, plugin_file, fixture_file):
    """reference defines reference::version; a new build refused by
    validation must leave that op served, and its samples must not be
    counted as the live version's calls."""
    plugin = load_plugin(plugin_file("reference"))
    x = torch.zeros(3, device=DEVICE)
    torch.ops.reference.version(x)
    torch.neg(x)
    before = max_device.list_ops()
    with pytest.raises(max_device.ValidationError):
        max_device.reload_plugin(plugin, fixture_file("wrong_kernel"), validate=True)
    assert max_device.list_ops() == before
    assert torch.ops.reference.version(x).tolist() == [1.0] * 3
    assert plugin.version == "1.0.0" and plugin.generation == 1


def test_listings_do_not_wait_for_a_validation(load_plugin, plugin_file):
    """Validation of the reference plugin runs for seconds with the change
    in progress; listings from another thread return meanwhile."""
    plugin = load_plugin(plugin_file("reference"))
    done = threading.Event()

    def reload_validated():
        try:
            max_device.reload_plugin(plugin, plugin_file("reference_v2"), validate=True)
        finally:
            done.set()

    changer = threading.Thread(target=reload_validated)
    changer.start()
    try:
        time.sleep(0.5)  # the change is validating now
        assert not done.is_set(), "validation finished too fast for this test to mean anything"
        listed = [p.name for p in max_device.list_plugins()], max_device.list_ops(), max_device.get_plugin("reference")
        assert listed[0] == ["reference"] and not done.is_set()
    finally:
        changer.join(300)
    assert plugin.version == "2.0.0"
