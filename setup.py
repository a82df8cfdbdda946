"""Builds the C++ core with CMake into the package being installed.

Use `pip wheel --no-build-isolation .` or `pip install --no-build-isolation .`
(see pyproject.toml): the extension links the torch that is already
installed, which must be in the supported range ([tool.max_device]
supported-torch), and the wheel requires that torch's minor version.

MAXDEV_WHEEL_BUILD_DIR: the CMake build tree to build and install from
(default build-wheel/, configured Release here); an existing tree such as
build/ makes packaging a matter of seconds.
"""

import os
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
CMAKE_BUILD_DIR = os.path.abspath(os.environ.get("MAXDEV_WHEEL_BUILD_DIR") or os.path.join(ROOT, "build-wheel"))


def _torch_requirement() -> str:
    """torch==<major>.<minor>.* of the installed torch, which must be in the
    supported range."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    import torch

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        supported = SpecifierSet(tomllib.load(f)["tool"]["max_device"]["supported-torch"])
    installed = Version(torch.__version__)
    if Version(installed.base_version) not in supported:
        sys.exit(f"max_device: the installed torch {torch.__version__} is outside the supported range {supported}")
    return f"torch=={installed.major}.{installed.minor}.*"


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        package_dir = os.path.abspath(os.path.join(self.build_lib, "max_device"))
        if not os.path.isfile(os.path.join(CMAKE_BUILD_DIR, "CMakeCache.txt")):
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", CMAKE_BUILD_DIR, f"-DPython3_EXECUTABLE={sys.executable}",
                "-DCMAKE_BUILD_TYPE=Release", "-DMAXDEV_BUILD_TESTS=OFF", "-DMAXDEV_BUILD_BENCH=OFF",
                "-DMAXDEV_BUILD_PLUGINS=OFF"])
        subprocess.check_call(["cmake", "--build", CMAKE_BUILD_DIR, "-j", str(os.cpu_count() or 1),
                               "--target", "max_device_python"])
        # The loader and _C (RPATH $ORIGIN, stripped), and the plugin SDK.
        subprocess.check_call(["cmake", "--install", CMAKE_BUILD_DIR, "--component", "python", "--strip",
                               "--prefix", package_dir])
        subprocess.check_call(["cmake", "--install", CMAKE_BUILD_DIR, "--component", "plugin_api",
                               "--prefix", os.path.join(package_dir, "sdk")])


class BinaryDistribution(Distribution):
    """Not pure Python: the wheel holds compiled libraries for this platform."""

    def has_ext_modules(self):
        return True


setup(
    install_requires=[_torch_requirement()],
    cmdclass={"build_py": BuildWithCMake},
    # Setuptools' own build and metadata directories go to the CMake tree: an
    # .egg-info under python/ would make the development checkout look like an
    # installed max_device (with its torch.backends entry point).
    options={"build": {"build_base": os.path.join(CMAKE_BUILD_DIR, "setuptools")},
             "egg_info": {"egg_base": os.path.relpath(CMAKE_BUILD_DIR, ROOT)}},
    distclass=BinaryDistribution,
)
