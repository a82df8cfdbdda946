"""Shared fixtures of the max_device Python tests."""

import json
import os
import re
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
    """One line per OpInfo configuration (test_opinfo.py's classes
    TestOpInfo<configuration>MAX_DEVICE): how many cases passed, failed, are
    declared gaps (xfailed) or were skipped."""
    counts = {}
    for outcome in ("passed", "failed", "xfailed", "xpassed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            found = re.search(r"test_opinfo\.py::TestOpInfo(\w+)MAX_DEVICE::", getattr(report, "nodeid", ""))
            if found:
                per_config = counts.setdefault(found.group(1), {})
                per_config[outcome] = per_config.get(outcome, 0) + 1
    for config, per_config in sorted(counts.items()):
        line = ", ".join(f"{n} {outcome}" for outcome, n in sorted(per_config.items()))
        terminalreporter.write_line(f"OpInfo on max_device vs CPU [{config}]: {line}")


# --- Plugins -----------------------------------------------------------------
# Built artifacts the plugin tests load, found through the build directory:
# $MAXDEV_BUILD_DIR (the Makefile sets it), else <repo>/build.

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_dir_path():
    return os.path.abspath(os.environ.get("MAXDEV_BUILD_DIR") or os.path.join(REPO_ROOT, "build"))


def build_paths():
    """build/test_paths.json ({"fixtures", "plugins", "external_plugin"}), or
    None when the build has not written it."""
    path = os.path.join(build_dir_path(), "test_paths.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def build_dir():
    """The CMake build directory; skips plugin tests when it is not built."""
    if build_paths() is None:
        pytest.skip(f"no build at {build_dir_path()} (run `make build`, or set MAXDEV_BUILD_DIR)")
    return build_dir_path()


@pytest.fixture(scope="session")
def artifacts(build_dir):
    return build_paths()


def _built_file(directory, pattern):
    """name -> the built file `pattern.format(name)` in `directory`."""
    def path(name):
        p = os.path.join(directory, pattern.format(name))
        assert os.path.isfile(p), f"{p} is not built"
        return p
    return path


@pytest.fixture(scope="session")
def plugin_file(artifacts):
    """plugin_file("reference") -> <build>/plugins/libreference.so."""
    return _built_file(artifacts["plugins"], "lib{}.so")


@pytest.fixture(scope="session")
def fixture_file(artifacts):
    """fixture_file("good") -> <build>/tests/fixtures/good.so."""
    return _built_file(artifacts["fixtures"], "{}.so")


@pytest.fixture(scope="session")
def external_plugin_file(artifacts):
    """libhello.so, built outside the tree by the ctest external_plugin_builds_from_installed_sdk."""
    p = os.path.join(artifacts["external_plugin"], "libhello.so")
    if not os.path.isfile(p):
        pytest.skip(f"{p} does not exist: run `cd {build_dir_path()} && ctest -R external` first")
    return p


@pytest.fixture
def load_plugin():
    """max_device.load_plugin that unloads, at the end of the test, every
    plugin it loaded and the test did not unload itself."""
    loaded = []

    def load(path, **kwargs):
        plugin = max_device.load_plugin(path, **kwargs)
        loaded.append(plugin)
        return plugin

    yield load
    for plugin in reversed(loaded):
        if any(p.name == plugin.name for p in max_device.list_plugins()):
            max_device.unload_plugin(plugin.name)


@pytest.fixture(autouse=True)
def no_plugin_left_loaded():
    """Plugins stay loaded process-wide: a test that leaves one loaded fails
    (and the plugin is unloaded so the next test starts clean)."""
    yield
    left = [p.name for p in max_device.list_plugins()]
    for name in left:
        max_device.unload_plugin(name)
    if left:
        pytest.fail(f"the test left plugins loaded: {left}")


def op_stats(op):
    """(calls, declines, fallbacks) of one op in max_device.list_ops(),
    summed over its provider stack; (0, 0, 0) when no plugin serves it."""
    for entry in max_device.list_ops():
        if entry["op"] == op and not entry.get("via"):
            return (sum(l["calls"] for l in entry["layers"]),
                    sum(l["declines"] for l in entry["layers"]), entry["fallbacks"])
    return (0, 0, 0)


# --- Temporary virtual environments ------------------------------------------
# Installing into a fresh venv is what users do; these stay fast and offline:
# no pip inside the venv (the running pip installs into it with --python),
# --no-deps --no-index, and torch from the running environment (a .pth file,
# which adds a directory without running its .pth files, so the development
# checkout's max_device stays out unless asked for).

TORCH_SITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def sanitizer_preloaded():
    """pip and CMake under a preloaded sanitizer runtime test nothing of ours."""
    return any(name in os.environ.get("LD_PRELOAD", "") for name in ("libasan", "libtsan"))


def make_venv(path, *site_dirs):
    """A venv at `path` without pip that also imports from `site_dirs`;
    returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = os.path.join(str(path), "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "outside.pth"), "w", encoding="utf-8") as f:
        f.write("".join(f"{d}\n" for d in site_dirs))
    return python


def pip_install(python, *wheels):
    """Install wheel files into the venv of `python`: no dependencies, no index."""
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
                    *map(str, wheels)], check=True)


def run_in_venv(python, code, env=None, args=(), timeout=120):
    """Run `code` with the venv's python from outside the checkout, with no
    PYTHONPATH: it imports only what the venv holds or its .pth names."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "MAX_DEVICE_FALLBACK", "MAX_DEVICE_LOG_LEVEL", "MAX_DEVICE_PLUGIN_PATH")}
    full_env.update(env or {})
    return subprocess.run([python, "-c", code, *args], env=full_env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(python))
