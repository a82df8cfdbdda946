"""The user documentation under test, so it cannot drift from the code:
every option of load_plugin / reload_plugin / watch with the default the
code has, every Plugin attribute, every list_ops() field, one CMake path
story, and the README's Python blocks marked `python runnable` run."""

import inspect
import json
import os
import re

import pytest
import torch

import max_device

from conftest import DEVICE, REPO_ROOT, run_python

README = os.path.join(REPO_ROOT, "README.md")
PLUGIN_API_README = os.path.join(REPO_ROOT, "plugin_api", "README.md")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def signature_line(fn):
    """`max_device.fn(a, b=default, *, c=default)` from the code."""
    parts, keyword_only = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return f"max_device.{fn.__name__}({', '.join(parts)})"


def section(text, heading):
    return text.split(heading, 1)[1].split("\n#", 1)[0]


@pytest.mark.parametrize("fn", [max_device.load_plugin, max_device.reload_plugin, max_device.watch],
                         ids=lambda fn: fn.__name__)
def test_every_option_is_documented_with_the_default_the_code_has(fn):
    options = section(read(README), "### Options of `load_plugin`, `reload_plugin` and `watch`")
    assert signature_line(fn) in options, f"README's signature of {fn.__name__} differs from the code's: " \
                                          f"{signature_line(fn)}"
    explained = set(re.findall(r"^\| `(\w+)` \|", options, re.M))
    missing = set(inspect.signature(fn).parameters) - explained
    assert not missing, f"options of {fn.__name__} without a row in README's table: {sorted(missing)}"


def test_every_option_of_the_watch_command_is_documented():
    source = read(os.path.join(REPO_ROOT, "python", "max_device", "__main__.py"))
    options = set(re.findall(r'p_watch\.add_argument\("(--[\w-]+)"', source))
    usage = " ".join(read(README).split("`python -m max_device watch PLUGIN...", 1)[1].split("`", 1)[0].split())
    assert options and options == set(re.findall(r"\[(--[\w-]+)", usage)), (options, usage)


def plugin_attributes():
    return {name for name, value in vars(max_device.Plugin).items()
            if isinstance(value, property) and not name.startswith("_")}


def test_every_plugin_attribute_is_documented():
    text = read(README)
    bullet = text.split("- **A `Plugin` is a handle on one load**", 1)[1].split("\n- ", 1)[0]
    listed = set(re.findall(r"`(\w+)`", bullet.split("serving now:", 1)[1].split("Once", 1)[0]))
    assert listed == plugin_attributes(), (
        f"README lists {sorted(listed - plugin_attributes())} that are no attributes, and misses "
        f"{sorted(plugin_attributes() - listed)}")
    docstring = set(re.findall(r"``(\w+)``", max_device.Plugin.__doc__))
    assert plugin_attributes() <= docstring, sorted(plugin_attributes() - docstring)


def test_every_list_ops_field_is_documented(load_plugin, plugin_file):
    load_plugin(plugin_file("reference"))
    torch.relu(torch.ones(2, device=DEVICE))
    table = max_device.list_ops()
    bullet = read(README).split("- **`list_ops()`** returns an", 1)[1].split("\n- ", 1)[0]
    assert f"`{type(table).__name__}`" in bullet
    fields = {key for entry in table for key in entry} | {key for entry in table for layer in entry["layers"]
                                                         for key in layer}
    named = set(re.findall(r"`(\w+)`", bullet))
    assert fields <= named, f"list_ops() fields the README does not explain: {sorted(fields - named)}"


def test_one_cmake_path_story():
    """Every doc points CMake at the SDK the same way: --cmake-dir."""
    for path in (README, PLUGIN_API_README):
        text = read(path)
        assert "CMAKE_PREFIX_PATH" not in text, path
        for value in re.findall(r"MaxDevicePlugin_DIR=(\S*)", text):
            assert value in ("", "$(python"), f"{path}: -DMaxDevicePlugin_DIR={value}: use $(python -m max_device " \
                                              f"--cmake-dir)"
        assert "-DMaxDevicePlugin_DIR=$(python -m max_device --cmake-dir)" in " ".join(text.split()), path


RUN_SNIPPETS = r"""
import json, os, sys, traceback
import max_device
failures = []
for number, code in enumerate(json.loads(sys.argv[1])):
    try:
        exec(compile(code, f"README runnable block {number}", "exec"), {})
    except BaseException:
        failures.append(traceback.format_exc())
    for plugin in max_device.list_plugins():
        max_device.unload_plugin(plugin)
print(json.dumps(failures))
"""


def test_the_readmes_runnable_python_blocks_run(artifacts, tmp_path):
    """In one fresh interpreter, from a directory whose `build/` is this
    build (the paths the README uses)."""
    blocks = re.findall(r"```python runnable\n(.*?)```", read(README), re.S)
    assert len(blocks) >= 3
    os.symlink(os.path.dirname(artifacts["plugins"]), tmp_path / "build")
    done = run_python(f"import os; os.chdir({str(tmp_path)!r})\n" + RUN_SNIPPETS, args=[json.dumps(blocks)],
                      timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)
