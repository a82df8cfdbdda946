"""max_device.testing.check_plugin and `python -m max_device check`:
OpInfo samples on every op a plugin serves, opcheck and author references
for custom ops."""

import json
import math

import pytest
import torch

import max_device
from max_device.testing import DECLINED, FAILED, NOT_COVERED, PASSED, check_plugin

from conftest import run_python


@pytest.fixture(scope="module")
def reference_result(plugin_file):
    """The reference plugin checked once at each kernel's declared dtypes
    (float32; "any" for add/sub/mul/div, checked as float32, float64, int64)."""
    return check_plugin(plugin_file("reference"), quiet=True)


def rows(result, op):
    return {r.dtype: r for r in result.results if r.op == op}


def test_the_reference_plugin_passes_every_op_and_dtype_it_accepts(reference_result):
    assert reference_result.passed, reference_result
    assert reference_result.failures == []
    float32 = [r for r in reference_result.results if r.dtype == "float32"]
    passed = [r for r in float32 if r.status == PASSED]
    assert len(passed) >= len(float32) // 2
    # The reference accepts float32 only: no float32 row is declined, and
    # its "any dtype" kernels decline the other dtypes.
    assert all(r.status in (PASSED, NOT_COVERED) for r in float32)
    assert {r.status for r in reference_result.results if r.dtype != "float32"} <= {DECLINED, NOT_COVERED}
    for r in passed:
        assert r.samples > 0 and r.failures == []
    for r in float32:
        if r.status == NOT_COVERED:
            assert r.note, r


def test_a_wrong_kernel_is_caught_naming_the_op_and_the_sample(fixture_file):
    result = check_plugin(fixture_file("wrong_kernel"), quiet=True)
    assert not result.passed
    row = rows(result, "aten::neg.out")["float32"]
    assert row.status == FAILED
    worst = row.worst
    assert worst.op == "aten::neg.out" and worst.source == "neg"
    assert worst.max_abs == pytest.approx(1.0, rel=1e-3)  # 1 - x against -x
    text = str(result)
    assert "aten::neg.out" in text and f"sample {worst.sample}: {worst.description}" in text
    assert "FAILED" in result.summary()


def test_each_variant_is_judged_where_it_reaches_the_kernel(fixture_file):
    # wrong_kernel's neg.out declines non-contiguous tensors (they run on the
    # CPU fallback, correctly); the other variants run it, and fail.
    result = check_plugin(fixture_file("wrong_kernel"), quiet=True)
    row = rows(result, "aten::neg.out")["float32"]
    # the extremal layouts that stay contiguous (offset, 0-dim, large
    # values) reach it too, and so does neg's backward (which calls neg.out)
    assert {f.variant for f in row.failures} == {"function", "out", "inplace", "extremal_large_values",
                                                 "extremal_offset", "extremal_zero_dim", "autograd"}
    assert row.declined > 0


def test_a_dtype_the_kernel_declines_is_reported_declined(plugin_file):
    result = check_plugin(plugin_file("reference"), ops=["aten::neg.out"], dtypes=["float32", "float64"],
                          quiet=True)
    by_dtype = rows(result, "aten::neg.out")
    assert by_dtype["float32"].status == PASSED
    assert by_dtype["float64"].status == DECLINED
    assert by_dtype["float64"].samples == 0 and by_dtype["float64"].declined > 0
    assert result.passed  # declining is not failing


def test_a_path_is_loaded_for_the_check_and_a_plugin_object_is_left_loaded(plugin_file, load_plugin):
    check_plugin(plugin_file("reference"), ops=["neg"], quiet=True)
    assert max_device.list_plugins() == []
    plugin = load_plugin(plugin_file("reference"))
    result = check_plugin(plugin, ops=["neg"], quiet=True)
    assert [r.op for r in result.results] == ["aten::neg.out"]
    assert plugin.loaded


def test_progress_is_one_line_per_op_on_stderr(plugin_file, capsys):
    check_plugin(plugin_file("reference"), ops=["aten::neg.out", "aten::mm.out"])
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("[")]
    assert progress[0].startswith("[1/2] aten::neg.out: float32 passed")
    assert progress[1].startswith("[2/2] aten::mm.out: float32 passed")


def test_an_op_the_plugin_does_not_serve_is_refused(plugin_file):
    with pytest.raises(ValueError, match="aten::cos"):
        check_plugin(plugin_file("reference"), ops=["cos"], quiet=True)


def test_the_result_is_json_serializable(fixture_file):
    data = json.loads(json.dumps(check_plugin(fixture_file("wrong_kernel"), quiet=True).to_json()))
    assert data["passed"] is False
    assert data["results"][0]["worst"]["op"] == "aten::neg.out"


# --- Ops without an OpInfo ---------------------------------------------------

NEGATE = "fixture_ns::negate.out"
# opcheck's tests that a plugin's custom op can pass without a fake kernel
# (the C ABI has none; torch.library.register_fake adds one from Python).
WITHOUT_FAKE = ("test_schema", "test_autograd_registration")


def negate_samples(dtype):
    for shape in [(3,), (2, 5)]:
        yield (torch.randn(shape).to(dtype),), {"out": torch.empty(shape, dtype=dtype)}


def test_a_custom_op_without_samples_is_reported_not_covered(fixture_file):
    result = check_plugin(fixture_file("custom_op"), quiet=True)
    row = rows(result, NEGATE)["float32"]
    assert row.status == NOT_COVERED and "samples=" in row.note
    assert result.passed


def test_a_custom_op_is_checked_with_opcheck_and_the_reference(fixture_file):
    result = check_plugin(fixture_file("custom_op"), samples={NEGATE: negate_samples},
                          references={NEGATE: lambda x, out: -x}, opcheck_tests=WITHOUT_FAKE, quiet=True)
    row = rows(result, NEGATE)["float32"]
    assert row.status == PASSED, result
    assert row.samples == 4  # two samples, each through opcheck and the reference


def test_a_custom_op_that_disagrees_with_the_reference_fails(fixture_file):
    result = check_plugin(fixture_file("custom_op"), samples={NEGATE: negate_samples},
                          references={NEGATE: lambda x, out: x}, opcheck_tests=WITHOUT_FAKE, quiet=True)
    worst = rows(result, NEGATE)["float32"].worst
    assert not result.passed and worst.variant == "reference" and worst.op == NEGATE
    assert not math.isnan(worst.max_abs) and worst.max_abs > 0


def test_opcheck_reports_a_missing_fake_kernel(fixture_file):
    # fixture_ns::negate.out has no meta function (and no register_fake)
    result = check_plugin(fixture_file("custom_op"), samples={NEGATE: negate_samples},
                          references={NEGATE: lambda x, out: -x}, quiet=True)
    failures = rows(result, NEGATE)["float32"].failures
    assert {f.variant for f in failures} == {"opcheck"}  # the reference agrees
    assert "test_faketensor" in failures[0].error


def rms_norm_samples(dtype):
    yield (torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype), 1e-6), {}


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_a_custom_op_with_a_meta_function_passes_every_opcheck_test(plugin_file):
    result = check_plugin(plugin_file("sdk_example"), ops=["myplug::rms_norm"],
                          samples={"myplug::rms_norm": rms_norm_samples},
                          references={"myplug::rms_norm": rms_norm}, quiet=True)
    assert result.passed, result.table()
    assert rows(result, "myplug::rms_norm")["float32"].status == PASSED


def test_references_need_samples(plugin_file):
    with pytest.raises(ValueError, match="samples="):
        check_plugin(plugin_file("sdk_example"), references={"myplug::rms_norm": lambda *a: None}, quiet=True)


# --- The command line --------------------------------------------------------

def run_check(*args):
    return run_python("import sys; from max_device.__main__ import main; sys.exit(main(sys.argv[1:]))",
                      args=["check", *args, "--quiet"], timeout=300)


def test_the_cli_exits_non_zero_on_a_wrong_kernel(fixture_file):
    done = run_check(fixture_file("wrong_kernel"))
    assert done.returncode == 1, done.stderr
    assert "aten::neg.out" in done.stdout and "failed" in done.stdout


def test_the_cli_exits_zero_on_the_reference_plugin_and_prints_json(plugin_file):
    done = run_check(plugin_file("reference"), "--ops", "neg,aten::mm.out", "--dtypes", "float32", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["passed"] and [r["op"] for r in data["results"]] == ["aten::neg.out", "aten::mm.out"]
