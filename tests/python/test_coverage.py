"""The core-op coverage report: how each op PyTorch tags core runs on
max_device."""

import json

import torch

import max_device
from max_device.coverage import CATEGORIES, core_op_coverage, core_ops

from conftest import run_python

DEVICE = "max_device"
CLI = "import sys; from max_device.__main__ import main; sys.exit(main(sys.argv[1:]))"


def test_every_core_op_is_in_exactly_one_category():
    report = core_op_coverage()
    counts = report.counts()
    assert sum(counts.values()) == len(core_ops()) == len(report.ops)
    assert set(report.ops.values()) <= set(CATEGORIES)
    assert "aten::add.Tensor" in report.ops and "aten::add.out" not in report.ops  # out= is not core


def test_a_loaded_plugin_moves_its_ops_and_their_structured_variants_to_plugin(load_plugin, plugin_file):
    before = core_op_coverage()
    assert before.ops["aten::add.Tensor"] == "fallback"  # its add.out runs on the CPU fallback
    plugin = load_plugin(plugin_file("reference"))
    after = core_op_coverage(plugin)
    assert after.ops["aten::add.Tensor"] == "plugin"
    assert after.providers["aten::add.Tensor"] == "reference@1.0.0 via aten::add.out"
    assert after.ops["aten::relu"] == "plugin" and after.providers["aten::relu"] == "reference@1.0.0"
    assert after.counts()["plugin"] > 0
    assert sum(after.counts().values()) == sum(before.counts().values())
    max_device.unload_plugin(plugin)
    assert core_op_coverage().ops["aten::add.Tensor"] == "fallback"


def test_the_categories_say_what_runs():
    report = core_op_coverage()
    assert report.ops["aten::view"] == "max_device"
    # An op reported as falling back really reaches the CPU fallback.
    assert report.ops["aten::flip"] == "fallback"
    torch.flip(torch.arange(4.0, device=DEVICE), [0])
    assert max_device.fallback_counts().get("aten::flip") == 1
    # A trampoline no plugin serves runs the CPU's kernel, over the op's composite.
    assert report.ops["aten::native_layer_norm"] == "fallback"
    torch.native_layer_norm(torch.ones(2, 3, device=DEVICE), [3], None, None, 1e-5)
    assert max_device.fallback_counts().get("aten::native_layer_norm") == 1


def test_the_cli_prints_the_report(plugin_file):
    done = run_python(CLI, args=["coverage", plugin_file("reference"), "--json"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sum(data["counts"].values()) == data["core_ops"] == len(core_ops())
    assert "aten::add.Tensor" in data["ops"]["plugin"]
