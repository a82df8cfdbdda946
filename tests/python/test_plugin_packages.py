"""Plugins shipped as Python wheels (entry point group max_device.plugins).

The build packages plugins/reference with max_device_add_plugin_wheel
(<build>/plugins/wheels/); these tests install that wheel into a fresh venv
(offline, no dependencies; torch and this checkout's max_device from the
running environment) and use it there as a user would: listed by
available_plugins(), loaded by name after the explicit search path, its
installed file checked before it is loaded.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, TORCH_SITE_DIR, make_venv, pip_install, run_in_venv, sanitizer_preloaded

pytestmark = pytest.mark.skipif(sanitizer_preloaded(), reason="pip under a sanitizer runtime")

DISTRIBUTION = "max-device-plugin-reference"
PACKAGE = "max_device_plugin_reference"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_json(python, code, args=()):
    """Run `code` in the venv; it prints one JSON document as its last line."""
    run = run_in_venv(python, "import json, torch, max_device\n" + code, args=args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference_wheel(artifacts):
    [wheel] = glob.glob(os.path.join(artifacts["plugins"], "wheels", f"{PACKAGE}-*.whl"))
    return wheel


@pytest.fixture(scope="module")
def venv(reference_wheel, tmp_path_factory):
    python = make_venv(tmp_path_factory.mktemp("plugin-venv") / "venv", TORCH_SITE_DIR, PYTHON_DIR)
    pip_install(python, reference_wheel)
    return python


# One interpreter in the venv plays the whole scenario (starting one costs
# seconds); each test checks its part of the record.
SCENARIO = """
import os, sys
out = {}
out["listed"] = [[p.name, p.package, p.version, p.path, p.problem] for p in max_device.available_plugins()]
path = max_device.available_plugins()[0].path

p = max_device.load_plugin("reference")
x = torch.arange(6, dtype=torch.float32, device="max_device")
out["loaded"] = {"path": p.path, "origin": p.origin, "version": p.version, "y": (x + x).cpu().tolist(),
                 "calls": [sum(l["calls"] for l in e["layers"])
                           for e in max_device.list_ops() if e["op"] == "aten::add.out"]}
max_device.unload_plugin(p)

max_device.set_plugin_path([sys.argv[1]])
p = max_device.load_plugin("reference")
out["search_path_first"] = [p.version, p.origin]
max_device.unload_plugin(p)
max_device.set_plugin_path([])

def refused(error_type):
    try:
        max_device.load_plugin("reference")
        return "loaded"
    except error_type as e:
        return [str(e), e.plugin, max_device.list_plugins() == []]

os.chmod(path, 0o777)
out["writable_by_others"] = refused(max_device.UntrustedPluginError)
os.chmod(path, 0o755)

original = open(path, "rb").read()
with open(path, "r+b") as f:  # same size, one byte changed
    f.seek(len(original) // 2)
    f.write(bytes([original[len(original) // 2] ^ 0xFF]))
out["changed_listed"] = max_device.available_plugins()[0].problem
out["changed"] = refused(max_device.HashMismatchError)
with open(path, "wb") as f:
    f.write(original)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def scenario(venv, plugin_file, tmp_path_factory):
    search_dir = tmp_path_factory.mktemp("search")
    shutil.copy(plugin_file("reference_v2"), search_dir / "libreference.so")
    record = run_json(venv, SCENARIO, args=[str(search_dir)])
    record["search_dir"] = str(search_dir)
    return record


def test_installed_plugin_is_listed_with_package_version_and_path(venv, scenario, plugin_file):
    [listed] = scenario["listed"]
    name, package, version, path, problem = listed
    assert (name, package, version, problem) == ("reference", DISTRIBUTION, "1.0.0", None)
    assert path.startswith(os.path.dirname(os.path.dirname(venv))) and path.endswith(f"/{PACKAGE}/libreference.so")
    assert sha256(path) == sha256(plugin_file("reference"))


def test_load_by_name_finds_the_installed_plugin_and_it_serves(scenario):
    loaded = scenario["loaded"]
    assert loaded["path"] == scenario["listed"][0][3] and loaded["version"] == "1.0.0"
    assert loaded["origin"] == f"entry point: {DISTRIBUTION} 1.0.0"
    assert loaded["y"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0] and loaded["calls"] == [1]


def test_explicit_search_path_comes_before_installed_packages(scenario):
    assert scenario["search_path_first"] == ["2.0.0", f"set_plugin_path: {scenario['search_dir']}"]


def test_installed_file_writable_by_others_is_refused(scenario):
    message, plugin, nothing_loaded = scenario["writable_by_others"]
    assert scenario["listed"][0][3] in message and nothing_loaded


def test_installed_file_changed_after_installation_is_refused(scenario):
    message, plugin, nothing_loaded = scenario["changed"]
    assert scenario["changed_listed"] == message
    assert "changed after installation" in message and DISTRIBUTION in message
    assert plugin == "reference" and nothing_loaded


def fake_installed_package(site, name, entry_points, files=()):
    """A distribution as pip leaves it (dist-info with METADATA, entry points
    and RECORD), written by hand to declare what no helper would."""
    os.makedirs(os.path.join(site, name), exist_ok=True)
    for relative, data in files:
        with open(os.path.join(site, relative), "wb") as f:
            f.write(data)
    info = os.path.join(site, f"{name}-0.1.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[max_device.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("".join(f"{relative},,\n" for relative, _ in files))


def test_bad_declarations_are_listed_with_the_problem_and_refused(tmp_path, plugin_file, reference_wheel):
    python = make_venv(tmp_path / "venv", TORCH_SITE_DIR, PYTHON_DIR)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    plugin = open(plugin_file("reference"), "rb").read()
    fake_installed_package(site, "bad_plugins", {
        "outside": "bad_plugins:..",
        "missing": "bad_plugins:libmissing.so",
        "unhashed": "bad_plugins:libreference.so",
        "no_file": "bad_plugins",
    }, files=[("bad_plugins/libreference.so", plugin)])
    fake_installed_package(site, "other_reference", {"reference": "other_reference:libreference.so"})
    pip_install(python, reference_wheel)  # a second package declaring "reference"
    got = run_json(python, """
out = {"listed": {p.name + "/" + p.package: p.problem for p in max_device.available_plugins()}, "errors": {}}
for name in ("outside", "missing", "unhashed", "no_file", "reference"):
    try:
        max_device.load_plugin(name)
        out["errors"][name] = "loaded"
    except max_device.PluginError as e:
        out["errors"][name] = [type(e).__name__, str(e)]
out["loaded"] = [p.name for p in max_device.list_plugins()]
print(json.dumps(out))
""")
    listed, errors = got["listed"], got["errors"]
    assert "points outside the package directory" in listed["outside/bad_plugins"]
    assert "is not an installed file" in listed["missing/bad_plugins"]
    assert "lists no sha256" in listed["unhashed/bad_plugins"]
    assert "is not '<package>:<plugin file>'" in listed["no_file/bad_plugins"]
    assert listed[f"reference/{DISTRIBUTION}"] is None
    for name in ("outside", "missing", "unhashed", "no_file"):
        kind, message = errors[name]
        assert kind == "PluginNotFoundError" and f"plugin '{name}' of package bad_plugins 0.1" in message
    kind, message = errors["reference"]
    assert kind == "PluginError" and "declared by 2 installed packages" in message
    assert DISTRIBUTION in message and "other_reference" in message
    assert got["loaded"] == []


def test_python_helper_makes_the_same_wheel_as_cmake(plugin_file, reference_wheel, tmp_path):
    """`python -m max_device wheel` (name and version from the manifest) and
    max_device_add_plugin_wheel run the same builder: byte for byte the same
    wheel (fixed timestamps)."""
    run = subprocess.run([sys.executable, "-m", "max_device", "wheel", plugin_file("reference"),
                          "--out-dir", str(tmp_path)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
    assert run.returncode == 0, run.stderr
    wheel = run.stdout.strip().splitlines()[-1]
    assert os.path.basename(wheel) == os.path.basename(reference_wheel)
    assert sha256(wheel) == sha256(reference_wheel)
