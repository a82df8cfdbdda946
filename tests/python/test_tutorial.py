"""The tutorial plugin of plugin_api/README.md, taken from the README
itself, builds against the SDK and passes `check`: the docs cannot drift."""

import os
import re
import subprocess

import pytest

from max_device.testing import check_plugin

from conftest import REPO_ROOT

README = os.path.join(REPO_ROOT, "plugin_api", "README.md")


def tutorial_blocks():
    text = open(README, encoding="utf-8").read()
    section = text.split("## Tutorial", 1)[1].split("\n## ", 1)[0]
    return {lang: code for lang, code in re.findall(r"```(c|cmake)\n(.*?)```", section, re.S)}


def test_the_readme_tutorial_is_the_fixture():
    with open(os.path.join(REPO_ROOT, "tests", "fixtures", "external_plugin", "hello.c"), encoding="utf-8") as f:
        assert tutorial_blocks()["c"] == f.read()


def test_the_readme_tutorial_builds_and_passes_check(build_dir, tmp_path):
    blocks = tutorial_blocks()
    (tmp_path / "hello.c").write_text(blocks["c"])
    (tmp_path / "CMakeLists.txt").write_text(blocks["cmake"])
    cmake_dir = os.path.join(REPO_ROOT, "python", "max_device", "sdk", "lib", "cmake", "MaxDevicePlugin")
    if not os.path.isdir(cmake_dir):
        pytest.skip("the SDK is not installed into python/max_device/sdk (run `make build`)")
    for command in (["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"), f"-DMaxDevicePlugin_DIR={cmake_dir}"],
                    ["cmake", "--build", str(tmp_path / "build")]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    result = check_plugin(str(tmp_path / "build" / "libhello.so"), quiet=True)
    assert result.passed, result
    assert [(r.op, r.status) for r in result.results] == [("aten::neg.out", "passed")]
