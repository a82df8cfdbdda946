"""A plugin written from the docs, with each classic mistake, built out of
tree against the installed SDK (tests/fixtures/author_plugins): `check`
(Python and CLI) fails each one naming the problem, and passes the correct
one."""

import json
import os

import pytest

import max_device
from max_device.testing import check_plugin

from conftest import REPO_ROOT, build_dir_path, run_python

SAMPLES = os.path.join(REPO_ROOT, "tests", "fixtures", "author_plugins", "samples.py")

# plugin -> (op, the failing check variants that name the problem)
MISTAKES = {
    "mul_errors_on_out_size": ("aten::mul.out", {"out_empty", "out_wrong_size"}),
    "softmax_no_max": ("aten::_softmax.out", {"extremal_large_values"}),
    "mul_ignores_strides": ("aten::mul.out", {"noncontiguous"}),
    "swiglu_wrong": ("author::swiglu", {"reference"}),
    "broken_gradients": ("aten::_softmax.out", {"autograd"}),
}


@pytest.fixture(scope="module")
def author_plugin(artifacts):
    directory = artifacts.get("author_plugins")
    if directory is None or not os.path.isfile(os.path.join(directory, "libauthor_ok.so")):
        pytest.skip(f"author plugins not built: run `cd {build_dir_path()} && ctest -R author_plugins` first")
    return lambda name: os.path.join(directory, f"lib{name}.so")


def run_check(path, *args):
    return run_python("import sys; from max_device.__main__ import main; sys.exit(main(sys.argv[1:]))",
                      args=["check", path, "--quiet", *args], timeout=300)


def test_the_correct_plugin_passes(author_plugin):
    result = check_plugin(author_plugin("author_ok"), samples=SAMPLES, quiet=True)
    assert result.passed and result.uncovered == [], result
    assert {r.op for r in result.results} == {"aten::mul.out", "aten::_softmax.out",
                                              "aten::_softmax_backward_data.out", "author::swiglu"}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_check_fails_each_mistake_naming_it(author_plugin, mistake):
    op, variants = MISTAKES[mistake]
    result = check_plugin(author_plugin(mistake), samples=SAMPLES, quiet=True)
    assert not result.passed
    failed = {f.variant for f in result.failures if f.op == op}
    assert variants <= failed, (failed, str(result))
    assert any(v in str(result) for v in variants)  # the table names the failing check


def test_a_kernel_on_a_composite_op_is_refused_naming_the_op_to_serve(author_plugin):
    with pytest.raises(max_device.SchemaError, match=r"aten::softmax\.int.*CompositeImplicitAutograd.*"
                                                     r"serve aten::_softmax\.out instead"):
        check_plugin(author_plugin("softmax_on_composite"), quiet=True)
    assert max_device.list_plugins() == []


def test_the_cli_fails_each_mistake_and_passes_the_correct_plugin(author_plugin):
    done = run_check(author_plugin("author_ok"), "--samples", SAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    for mistake, (op, variants) in MISTAKES.items():
        done = run_check(author_plugin(mistake), "--samples", SAMPLES, "--json")
        assert done.returncode == 1, (mistake, done.stderr)
        data = json.loads(done.stdout)
        failed = {f["variant"] for r in data["results"] if r["op"] == op for f in r["failures"]}
        assert variants <= failed, (mistake, failed)
    done = run_check(author_plugin("softmax_on_composite"))
    assert done.returncode == 1 and "CompositeImplicitAutograd" in done.stderr and "aten::_softmax.out" in done.stderr


def test_a_custom_op_without_samples_fails_the_cli_unless_allowed(author_plugin):
    # without samples, a wrong swiglu is checked by nothing: not a pass
    done = run_check(author_plugin("swiglu_wrong"))
    assert done.returncode == 1 and "not covered: author::swiglu" in done.stderr, done.stderr
    assert "PASSED" in done.stdout  # every op that was checked passed; the exit status says the rest
    done = run_check(author_plugin("swiglu_wrong"), "--allow-uncovered")
    assert done.returncode == 0, done.stderr


def test_check_takes_a_file_in_the_current_directory_as_a_path(author_plugin, tmp_path):
    import shutil
    shutil.copy(author_plugin("author_ok"), tmp_path / "author_ok.so")
    done = run_python("import os, sys; os.chdir(sys.argv[1]); from max_device.__main__ import main; "
                      "sys.exit(main(['check', 'author_ok.so', '--quiet', '--allow-uncovered', '--json']))",
                      args=[str(tmp_path)], timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    kernels = {k["op"]: k for k in data["kernels"]}
    assert kernels["aten::mul.out"] == {"op": "aten::mul.out", "dtypes": ["float32"],
                                        "flags": ["same_dtype", "no_cpu_tensors"]}


def test_reload_validation_runs_the_same_checks_with_samples(author_plugin, load_plugin):
    plugin = load_plugin(author_plugin("author_ok"), name="author", validate=True, samples=SAMPLES)
    for mistake in ("swiglu_wrong", "softmax_no_max"):
        op, variants = MISTAKES[mistake]
        with pytest.raises(max_device.ValidationError) as caught:
            plugin.reload(author_plugin(mistake), validate=True, samples=SAMPLES)
        assert variants <= {f.variant for f in caught.value.report if f.op == op}
    assert max_device.get_plugin("author").generation == 1  # the correct version still serves


def test_isolated_validation_runs_the_same_checks_with_a_samples_file(author_plugin, load_plugin):
    """isolate=True: a fresh interpreter runs validate's checks, the
    author's samples included: the wrong swiglu (which only the samples
    reveal) is refused, the right one accepted."""
    plugin = load_plugin(author_plugin("author_ok"), name="author")
    with pytest.raises(max_device.ValidationError, match="isolated check failed") as caught:
        plugin.reload(author_plugin("swiglu_wrong"), isolate=True, validate=True, samples=SAMPLES)
    assert "author::swiglu" in str(caught.value) and caught.value.op == "author::swiglu"
    assert "reference" in {f.variant for f in caught.value.report if f.op == "author::swiglu"}
    assert plugin.generation == 1
    plugin.reload(author_plugin("author_ok"), isolate=True, validate=True, samples=SAMPLES, force=True)
    assert plugin.generation == 2


def test_isolated_validation_takes_functions_the_child_can_import(author_plugin, load_plugin, tmp_path,
                                                                    monkeypatch):
    (tmp_path / "swiglu_checks.py").write_text(
        "import torch\n"
        "def swiglu_samples(dtype):\n"
        "    yield (torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)), {}\n"
        "def swiglu_reference(gate, up):\n"
        "    return torch.nn.functional.silu(gate) * up\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import swiglu_checks
    plugin = load_plugin(author_plugin("author_ok"), name="author")
    with pytest.raises(max_device.ValidationError) as caught:
        plugin.reload(author_plugin("swiglu_wrong"), isolate=True, validate=True,
                      samples={"author::swiglu": swiglu_checks.swiglu_samples},
                      references={"author::swiglu": swiglu_checks.swiglu_reference})
    assert "reference" in {f.variant for f in caught.value.report if f.op == "author::swiglu"}
    assert plugin.generation == 1


def test_isolated_validation_refuses_functions_that_cannot_cross(author_plugin, load_plugin):
    plugin = load_plugin(author_plugin("author_ok"), name="author")
    before = max_device.list_ops()

    def nested(dtype):
        return []

    for samples, references, why in [
            ({"author::swiglu": nested}, None, "nested function"),
            ({"author::swiglu": nested.__call__}, None, "cannot be pickled"),
            (SAMPLES, {"author::swiglu": lambda gate, up: gate}, "lambda")]:
        with pytest.raises(TypeError, match=rf"plugin 'author' .*author::swiglu.*{why}.*samples='file\.py'"):
            plugin.reload(author_plugin("swiglu_wrong"), isolate=True, validate=True, samples=samples,
                          references=references)
    assert plugin.generation == 1 and max_device.list_ops() == before
