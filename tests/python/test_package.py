"""max_device as a package: what the build links, the wheel `pip wheel
--no-build-isolation .` makes, and that wheel installed into a fresh venv
(offline, against the running torch): its torch pin, the plugin SDK inside
it, and PyTorch's device backend autoload."""

import glob
import os
import subprocess
import sys
import zipfile

import pytest
import torch

import max_device
from conftest import REPO_ROOT, TORCH_SITE_DIR, make_venv, pip_install, run_in_venv, sanitizer_preloaded

TORCH_LIBRARIES = ("libtorch", "libc10", "libshm", "libcaffe2")


def needed(library):
    dynamic = subprocess.run(["readelf", "-d", library], check=True, capture_output=True, text=True).stdout
    return {line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}


def test_loader_links_only_the_torch_libraries_it_uses():
    package_dir = os.path.dirname(max_device.__file__)
    loader = needed(os.path.join(package_dir, "libmax_device_loader.so"))
    module = needed(max_device._C.__file__)
    assert {n for n in loader if n.startswith(TORCH_LIBRARIES)} == {"libtorch_cpu.so", "libc10.so"}
    assert {n for n in module if n.startswith(TORCH_LIBRARIES)} == \
        {"libtorch_cpu.so", "libc10.so", "libtorch_python.so"}


needs_plain_process = pytest.mark.skipif(sanitizer_preloaded(), reason="pip and CMake under a sanitizer runtime")


@pytest.fixture(scope="module")
def wheel(build_dir, tmp_path_factory):
    """`pip wheel --no-build-isolation .` of this checkout, packaged from the
    test's build tree (MAXDEV_WHEEL_BUILD_DIR: nothing to compile)."""
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, MAXDEV_WHEEL_BUILD_DIR=build_dir)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "-w", str(out), REPO_ROOT], check=True, env=env)
    [path] = glob.glob(str(out / "max_device-*.whl"))
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed; torch comes from the running
    environment, the development checkout stays out."""
    python = make_venv(tmp_path_factory.mktemp("venv") / "venv", TORCH_SITE_DIR)
    pip_install(python, wheel)
    return python


@needs_plain_process
def test_wheel_requires_the_torch_minor_it_was_built_against(wheel):
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read("max_device-0.1.0.dist-info/METADATA").decode()
        entry_points = zf.read("max_device-0.1.0.dist-info/entry_points.txt").decode()
        names = zf.namelist()
    major, minor = torch.__version__.split(".")[:2]
    assert [l for l in metadata.splitlines() if l.startswith("Requires-Dist:")] == \
        [f"Requires-Dist: torch=={major}.{minor}.*"]
    assert "[torch.backends]\nmax_device = max_device._autoload:load" in entry_points
    assert not wheel.endswith("-none-any.whl")  # it holds compiled libraries
    assert {"max_device/libmax_device_loader.so", "max_device/sdk/include/max_device/plugin.h"} <= set(names)


@needs_plain_process
def test_installed_package_is_the_one_imported_and_points_at_its_sdk(venv, tmp_path):
    run = run_in_venv(venv, "import max_device, max_device.__main__ as m, sys; print(max_device.__file__); "
                            "sys.argv = ['max_device', '--cmake-dir']; m.main()")
    assert run.returncode == 0, run.stderr
    package_file, cmake_dir = run.stdout.split()
    site = os.path.dirname(os.path.dirname(package_file))
    assert package_file.startswith(os.path.dirname(os.path.dirname(venv)))
    assert cmake_dir == os.path.join(site, "max_device", "sdk", "lib", "cmake", "MaxDevicePlugin")
    # An outside plugin project builds against that SDK alone.
    source = os.path.join(REPO_ROOT, "tests", "fixtures", "external_plugin")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", source, "-B", str(build), f"-DMaxDevicePlugin_DIR={cmake_dir}"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    assert (build / "libhello.so").is_file()


@needs_plain_process
def test_import_torch_autoloads_the_installed_device(venv):
    run = run_in_venv(venv, "import sys, torch\n"
                            "x = torch.randn(2, device='max_device')\n"
                            "print(x.device, 'max_device' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["max_device:0", "True"]


@needs_plain_process
def test_importing_max_device_first_still_works(venv):
    run = run_in_venv(venv, "import max_device, torch; print(torch.ones(2, device='max_device').sum().item())")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["2.0"]


@needs_plain_process
def test_autoload_off_leaves_torch_without_the_device(venv):
    run = run_in_venv(venv, "import sys, torch\n"
                            "print('max_device' in sys.modules)\n"
                            "torch.randn(2, device='max_device')",
                      env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert run.stdout.split() == ["False"]
    assert run.returncode != 0 and "RuntimeError" in run.stderr and "max_device" in run.stderr
