"""Builds the C++ core with CMake into the package being installed.

Use `pip install --no-build-isolation .` (see pyproject.toml): the extension
links the torch that is already installed.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        root = os.path.dirname(os.path.abspath(__file__))
        package_dir = os.path.abspath(os.path.join(self.build_lib, "max_device"))
        build_dir = os.path.join(root, "build-wheel")
        subprocess.check_call([
            "cmake", "-S", root, "-B", build_dir, f"-DPython3_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release", f"-DMAXDEV_PACKAGE_DIR={package_dir}",
            "-DMAXDEV_BUILD_TESTS=OFF", "-DMAXDEV_BUILD_BENCH=OFF", "-DMAXDEV_BUILD_PLUGINS=OFF"])
        subprocess.check_call(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 1),
                               "--target", "max_device_python"])
        subprocess.check_call(["cmake", "--install", build_dir, "--component", "plugin_api",
                               "--prefix", os.path.join(package_dir, "sdk")])


setup(cmdclass={"build_py": BuildWithCMake})
