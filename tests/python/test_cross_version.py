"""Plugins built with one PyTorch, loaded under another.

A plugin builds against plugin_api/ only, so the same binary must load and
pass under every PyTorch max_device supports. `make test-compat TORCH=x.y.z`
runs this file in its build tree with MAXDEV_PLUGINS_FROM=<default build>:
the loader is built against torch x.y.z, the plugins are the default
build's. Without MAXDEV_PLUGINS_FROM every test skips.
"""

import json
import os

import pytest
import torch

from max_device.testing import check_plugin

PLUGINS_FROM = os.environ.get("MAXDEV_PLUGINS_FROM")
pytestmark = pytest.mark.skipif(not PLUGINS_FROM, reason="run by `make test-compat` (MAXDEV_PLUGINS_FROM unset)")


@pytest.fixture(scope="module")
def other_build():
    with open(os.path.join(PLUGINS_FROM, "test_paths.json"), encoding="utf-8") as f:
        return json.load(f)


def other_plugin(other_build, name):
    path = os.path.join(other_build["plugins"], f"lib{name}.so")
    assert os.path.isfile(path), f"{path} is not built"
    return path


def test_plugins_were_built_with_another_torch(other_build):
    assert other_build["torch_version"] != torch.__version__


def test_reference_plugin_passes_its_check(other_build):
    result = check_plugin(other_plugin(other_build, "reference"), quiet=True)
    assert result.passed, str(result)


def test_sdk_plugin_defines_and_serves_its_ops(other_build, load_plugin):
    load_plugin(other_plugin(other_build, "sdk_example"))
    x, weight = torch.randn(4, 8), torch.randn(8)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    got = torch.ops.myplug.rms_norm(x.to("max_device"), weight.to("max_device"), 1e-6)
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(torch.nn.functional.silu(x.to("max_device")).cpu(), torch.nn.functional.silu(x))


def test_hot_swap_between_builds_of_the_other_torch(other_build, load_plugin):
    def served_version():
        return torch.ops.reference.version(torch.zeros(3, device="max_device"))[0].item()

    plugin = load_plugin(other_plugin(other_build, "reference"))
    assert served_version() == 1.0
    plugin.reload(other_plugin(other_build, "reference_v2"))
    assert served_version() == 2.0 and plugin.generation == 2
