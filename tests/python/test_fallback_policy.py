import warnings

import pytest
import torch

import max_device
from conftest import run_python

DEVICE = "max_device"
OP = "aten::index_select"


def dev(t):
    return t.to(DEVICE)  # a copy: a native kernel, never a fallback


def index_select():
    return torch.index_select(dev(torch.arange(6.0)), 0, dev(torch.tensor([1, 3])))


def cumsum():
    return dev(torch.arange(4.0)).cumsum(0)  # a structured op: falls back as the form called, aten::cumsum


def calls_with_warnings(fn, times):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # let the device decide what is "once"
        for _ in range(times):
            fn()
    return [w for w in caught if "max_device" in str(w.message)]


def test_default_is_allow_and_silent():
    assert max_device.fallback_policy() == "allow"
    assert max_device.fallback_policy(OP) == "allow"
    assert calls_with_warnings(index_select, 2) == []


def test_global_warn_once_per_op():
    max_device.set_fallback_policy("warn")
    assert max_device.fallback_policy() == "warn"
    caught = calls_with_warnings(index_select, 3)
    assert len(caught) == 1
    assert issubclass(caught[0].category, UserWarning)
    assert OP in str(caught[0].message)
    # another op warns once for itself
    caught = calls_with_warnings(lambda: cumsum(), 2)
    assert len(caught) == 1 and "aten::cumsum" in str(caught[0].message)
    # setting the policy again re-arms the warnings
    max_device.set_fallback_policy("warn")
    assert len(calls_with_warnings(index_select, 2)) == 1


def test_global_error_raises_naming_the_op():
    max_device.set_fallback_policy("error")
    with pytest.raises(NotImplementedError, match=OP):
        index_select()
    # native kernels (factories, views, copies) are not fallbacks
    x = dev(torch.zeros(3, 4))
    y = torch.empty(4, 3, device=DEVICE)
    y.copy_(x.t())
    v = x[1:].view(-1).unsqueeze(0).expand(2, 8)
    assert v.shape == (2, 8)
    x.to("cpu")
    x[0, 0].item()


def test_per_op_override():
    max_device.set_fallback_policy("error", op=OP)
    assert max_device.fallback_policy(OP) == "error"
    assert max_device.fallback_policy("index_select") == "error"  # aten:: is implied
    assert max_device.fallback_policy() == "allow"
    with pytest.raises(NotImplementedError, match=OP):
        index_select()
    cumsum()  # other ops still allowed
    # an op allowed while the global policy forbids
    max_device.set_fallback_policy("error")
    max_device.set_fallback_policy("allow", op=OP)
    assert index_select().tolist() == [1.0, 3.0]
    with pytest.raises(NotImplementedError, match="aten::cumsum"):
        cumsum()
    # removing the override falls back to the global policy
    max_device.set_fallback_policy(None, op=OP)
    assert max_device.fallback_policy(OP) == "error"
    with pytest.raises(NotImplementedError):
        index_select()


def test_per_op_warn_once():
    max_device.set_fallback_policy("warn", op="index_select")
    caught = calls_with_warnings(lambda: (index_select(), cumsum()), 3)
    assert len(caught) == 1 and OP in str(caught[0].message)


def test_overload_names_are_separate_ops():
    # fmax and clamp_min: ops no plugin of the suite serves, so they keep
    # their direct fallbacks (a provider of fmax.out would end fmax's)
    a = dev(torch.ones(3))
    max_device.set_fallback_policy("error", op="aten::fmax.out")
    with pytest.raises(NotImplementedError, match=r"aten::fmax\.out"):
        torch.fmax(a, a, out=torch.empty_like(a))
    a.fmax(a)  # aten::fmax: the CPU kernel of the form called, not fmax.out
    a.relu()


def test_error_leaves_tensors_intact():
    max_device.set_fallback_policy("error")
    x = dev(torch.arange(4.0))
    with pytest.raises(NotImplementedError, match=r"aten::clamp_min_"):
        x.clamp_min_(1)
    max_device.set_fallback_policy("allow")
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="allow"):
        max_device.set_fallback_policy("sometimes")
    with pytest.raises(ValueError):
        max_device.set_fallback_policy("sometimes", op=OP)
    with pytest.raises(ValueError):
        max_device.set_fallback_policy(None)
    with pytest.raises(TypeError):
        max_device.set_fallback_policy("warn", op="")
    assert max_device.fallback_policy() == "allow"


def test_counters():
    max_device.reset_fallback_counts()
    assert max_device.fallback_counts() == {}
    for _ in range(3):
        index_select()
    counts = max_device.fallback_counts()
    assert counts[OP] == 3
    assert list(counts) == sorted(counts)
    x = dev(torch.ones(4))
    x.fmax(x)
    assert max_device.fallback_counts()["aten::fmax"] == 1
    # calls refused by the policy are counted too: they reached the fallback
    max_device.set_fallback_policy("error", op=OP)
    with pytest.raises(NotImplementedError):
        index_select()
    assert max_device.fallback_counts()[OP] == 4
    max_device.reset_fallback_counts()
    assert max_device.fallback_counts() == {}


ENV_CODE = """
import sys, warnings, torch, max_device
op = sys.argv[1]
print("global", max_device.fallback_policy())
print("mm", max_device.fallback_policy(op))
a = torch.ones(2, 2).to("max_device")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a + a
    a + a
print("warnings", len([x for x in w if "aten::add.Tensor" in str(x.message)]))
try:
    torch.mm(a, a, out=torch.empty(2, 2, device="max_device"))
    print("mm ran")
except NotImplementedError as e:
    print("mm refused", op in str(e))
"""


def env_run(op):
    return run_python(ENV_CODE, env={"MAX_DEVICE_FALLBACK": f"warn,{op}=error"}, args=[op])


def test_env_var_in_subprocess():
    r = env_run("aten::mm.out")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "global warn" in lines
    assert "mm error" in lines
    assert "warnings 1" in lines
    assert "mm refused True" in lines


def test_env_var_bad_entry_is_reported_and_ignored():
    r = run_python("import max_device; print(max_device.fallback_policy())",
                   env={"MAX_DEVICE_FALLBACK": "bogus,error"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "error"
    assert "MAX_DEVICE_FALLBACK" in r.stderr and "bogus" in r.stderr


def test_env_var_base_op_name_covers_its_overloads():
    r = env_run("aten::mm")
    assert r.returncode == 0, r.stderr
    assert "mm refused True" in r.stdout.splitlines()
