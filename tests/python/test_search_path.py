"""Bare plugin names: looked up only in the explicit, ordered plugin search
path (set_plugin_path() first, then MAX_DEVICE_PLUGIN_PATH), never in the
current directory or LD_LIBRARY_PATH; list_plugins() shows the origin."""

import os
import shutil

import pytest

import max_device


@pytest.fixture(autouse=True)
def empty_search_path(monkeypatch):
    monkeypatch.delenv("MAX_DEVICE_PLUGIN_PATH", raising=False)
    max_device.set_plugin_path([])
    yield
    max_device.set_plugin_path([])


@pytest.fixture
def plugin_dir(tmp_path, plugin_file):
    """plugin_dir(name, plugin=, filename=) -> a directory holding a copy of
    a built plugin under `filename` (default lib<plugin>.so)."""
    def make(name, plugin="reference", filename=None):
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        shutil.copyfile(plugin_file(plugin), directory / (filename or "libreference.so"))
        return str(directory)
    return make


def test_set_plugin_path_comes_before_the_environment(monkeypatch, plugin_dir, load_plugin):
    configured, environment = plugin_dir("configured", "reference"), plugin_dir("env", "reference_v2")
    monkeypatch.setenv("MAX_DEVICE_PLUGIN_PATH", environment)
    max_device.set_plugin_path([configured])
    assert max_device.plugin_path() == [configured, environment]

    plugin = load_plugin("reference")
    assert plugin.path == os.path.join(configured, "libreference.so")
    assert plugin.origin == f"set_plugin_path: {configured}"
    assert max_device.inspect("reference").version == plugin.version
    max_device.unload_plugin(plugin)

    max_device.set_plugin_path([])
    plugin = load_plugin("reference")
    assert plugin.origin == f"MAX_DEVICE_PLUGIN_PATH: {environment}"
    assert [p.origin for p in max_device.list_plugins()] == [plugin.origin]
    assert plugin.version == max_device.inspect(os.path.join(environment, "libreference.so")).version


def test_environment_entries_are_searched_in_order(monkeypatch, plugin_dir, tmp_path, load_plugin):
    empty = tmp_path / "empty"
    empty.mkdir()
    second = plugin_dir("second", "reference_v2")
    monkeypatch.setenv("MAX_DEVICE_PLUGIN_PATH", f"{empty}:{second}:{plugin_dir('third')}")
    assert load_plugin("reference").origin == f"MAX_DEVICE_PLUGIN_PATH: {second}"


def test_lib_prefix_first_then_plain_name_then_exact_so_name(plugin_dir, load_plugin):
    directory = plugin_dir("both", "reference_v2", filename="reference.so")
    max_device.set_plugin_path([directory])
    assert load_plugin("reference").path.endswith("/reference.so")
    max_device.unload_plugin("reference")
    plugin_dir("both", "reference")
    assert load_plugin("reference").path.endswith("/libreference.so")
    max_device.unload_plugin("reference")
    assert load_plugin("reference.so").path == os.path.join(directory, "reference.so")


def test_bare_name_is_never_found_in_cwd_or_ld_library_path(monkeypatch, plugin_dir):
    here = plugin_dir("here")
    monkeypatch.chdir(here)
    monkeypatch.setenv("LD_LIBRARY_PATH", here)
    with pytest.raises(max_device.PluginNotFoundError) as info:
        max_device.load_plugin("libreference.so")
    message = str(info.value)
    assert "the plugin search path" in message and "is empty" in message
    assert "'./libreference.so'" in message
    assert max_device.list_plugins() == []


def test_path_with_a_slash_is_a_path(monkeypatch, plugin_dir, load_plugin):
    monkeypatch.chdir(plugin_dir("here"))
    plugin = load_plugin("./libreference.so")
    assert (plugin.path, plugin.origin) == ("./libreference.so", "path")


def test_not_found_lists_every_directory_searched(monkeypatch, tmp_path):
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    max_device.set_plugin_path([first])
    monkeypatch.setenv("MAX_DEVICE_PLUGIN_PATH", second)
    with pytest.raises(max_device.PluginNotFoundError) as info:
        max_device.load_plugin("missing")
    assert f"searched {first} (set_plugin_path), {second} (MAX_DEVICE_PLUGIN_PATH)" in str(info.value)
    assert "libmissing.so or missing.so" in str(info.value)
    assert info.value.file == "missing"


def test_relative_directories_are_refused_or_skipped(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="must be absolute"):
        max_device.set_plugin_path(["plugins"])
    monkeypatch.setenv("MAX_DEVICE_PLUGIN_PATH", f"::relative:{tmp_path}")
    assert max_device.plugin_path() == [str(tmp_path)]


def test_reload_by_bare_name_records_the_new_origin(plugin_dir, load_plugin):
    plugin = load_plugin(os.path.join(plugin_dir("first"), "libreference.so"))
    assert plugin.origin == "path"
    v2 = plugin_dir("v2", "reference_v2")
    max_device.set_plugin_path([v2])
    plugin.reload("reference")
    assert (plugin.generation, plugin.origin) == (2, f"set_plugin_path: {v2}")
    assert plugin.reload(force=True).origin == f"set_plugin_path: {v2}"  # same path: origin kept
