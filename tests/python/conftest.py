"""Shared fixtures of the max_device Python tests."""

import os
import subprocess
import sys

import pytest
import torch

import max_device

DEVICE = "max_device"
# Subprocesses import the same max_device package as this process.
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(max_device.__file__)))


@pytest.fixture(autouse=True)
def fallback_state():
    """Every test starts and ends with the fallback policy 'allow', no per-op
    overrides and zeroed counters, whatever it changed."""
    def restore():
        max_device.set_fallback_policy("allow")
        for op in list(max_device._C._op_fallback_policies()):
            max_device.set_fallback_policy(None, op=op)
        max_device._C._set_fallback_impl("zero_copy")
        max_device.reset_fallback_counts()

    restore()
    yield
    restore()


def run_python(code, env=None, args=(), timeout=120):
    """Run `code` in a fresh interpreter that imports max_device from this
    checkout; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ)
    full_env.pop("MAX_DEVICE_FALLBACK", None)
    full_env.pop("MAX_DEVICE_LOG_LEVEL", None)
    full_env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def device_copy(t):
    """The same values on max_device (a fresh device tensor)."""
    return t.to(DEVICE)


def pytest_terminal_summary(terminalreporter):
    """One line for the OpInfo suite: how many (op, dtype) cases and error
    checks passed, failed or are declared gaps."""
    counts = {}
    for key in ("passed", "failed", "xfailed", "xpassed", "skipped", "error"):
        for report in terminalreporter.stats.get(key, []):
            if "test_opinfo.py" in getattr(report, "nodeid", ""):
                counts[key] = counts.get(key, 0) + 1
    if counts:
        line = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        terminalreporter.write_line(f"OpInfo on max_device vs CPU: {line}")
