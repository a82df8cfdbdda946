"""Kernels on CompositeImplicitAutograd ops are refused (they silently drop
gradients) unless allow_composite=True, and `python -m max_device schema`
says which overload to serve."""

import json

import pytest
import torch

import max_device

from conftest import run_python

DEVICE = "max_device"


@pytest.fixture(scope="module")
def composite_plugin(artifacts):
    import os
    path = os.path.join(artifacts.get("author_plugins", ""), "libsoftmax_on_composite.so")
    if not os.path.isfile(path):
        pytest.skip("author plugins not built: run `ctest -R author_plugins` in the build directory")
    return path


def test_a_kernel_on_a_composite_op_is_refused_and_nothing_changes(composite_plugin):
    with pytest.raises(max_device.SchemaError) as caught:
        max_device.load_plugin(composite_plugin)
    error = caught.value
    assert error.op == "aten::softmax.int" and "aten::_softmax.out" in str(error)
    assert "allow_composite=True" in str(error)
    assert max_device.list_plugins() == [] and max_device.list_ops() == []


def test_allow_composite_serves_the_forward_only(load_plugin, composite_plugin):
    plugin = load_plugin(composite_plugin, allow_composite=True)
    assert plugin.allow_composite
    x = torch.randn(3, 4)
    d = x.to(DEVICE).requires_grad_()
    y = torch.softmax(d, 1)
    torch.testing.assert_close(y.detach().cpu(), torch.softmax(x, 1))
    with pytest.warns(UserWarning, match="autograd kernel was not registered"):
        y.sum().backward()
    assert d.grad is None  # what allow_composite accepts: no gradient through it
    assert plugin.reload(force=True).allow_composite  # kept across reloads


def test_the_opt_in_warns_once(composite_plugin):
    code = ("import max_device, sys\n"
            "for _ in range(2):\n"
            "    max_device.unload_plugin(max_device.load_plugin(sys.argv[1], allow_composite=True))\n")
    done = run_python(code, args=[composite_plugin])
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("aten::softmax.int is CompositeImplicitAutograd") == 1, done.stderr


def run_schema(*args):
    return run_python("import sys; from max_device.__main__ import main; sys.exit(main(sys.argv[1:]))",
                      args=["schema", *args])


def test_schema_says_which_overload_to_serve():
    done = run_schema("softmax", "--json")
    assert done.returncode == 0, done.stderr
    by_name = {o["name"]: o for o in json.loads(done.stdout)}
    assert by_name["aten::softmax.int"]["kind"] == "composite implicit"
    assert by_name["aten::softmax.int"]["serve"] == "aten::_softmax.out"
    assert by_name["aten::softmax.int_out"]["outputs"] == [3]
    done = run_schema("aten::add.Tensor")
    assert "structured (computed by aten::add.out)" in done.stdout and "serve aten::add.out instead" in done.stdout
    out = json.loads(run_schema("add.out", "--json").stdout)[0]
    assert out["kind"] == "structured out=" and out["serve"] == "aten::add.out" and out["autograd"] == "own formula"
    done = run_schema("no_such_op_anywhere")
    assert done.returncode == 1 and "no operator named" in done.stderr


def test_unloading_the_opt_in_plugin_gives_softmax_its_gradients_back(composite_plugin):
    max_device.unload_plugin(max_device.load_plugin(composite_plugin, allow_composite=True))
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::softmax.int", "PrivateUse1")
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    (torch.softmax(x, 1) * torch.arange(4.0, device=DEVICE)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
