"""Trust and integrity of plugin files: ownership and permission checks,
the explicit opt-in, and sha256 pinning. Every refusal is typed, names the
file (and the plugin when known) and changes nothing."""

import hashlib
import os
import shutil

import pytest
import torch

import max_device

OTHER_UID = 65534  # nobody


def observable_state():
    """What a user can see of the registry, and the snapshot files on disk."""
    plugins = [(p.name, p.sha256, p.generation) for p in max_device.list_plugins()]
    ops = [(e["op"], [l["owner"] for l in e["layers"]]) for e in max_device.list_ops()]
    return plugins, ops, sorted(os.listdir(max_device._C._snapshot_directory()))


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def place(tmp_path, plugin_file):
    """place(dir_mode=, file_mode=, dir_owner=, file_owner=, plugin=) copies
    a built plugin into a fresh directory with that ownership and mode."""
    count = [0]

    def place_copy(dir_mode=0o755, file_mode=0o644, dir_owner=None, file_owner=None, plugin="reference"):
        count[0] += 1
        directory = tmp_path / f"d{count[0]}"
        directory.mkdir()
        target = directory / "libplugin.so"
        shutil.copyfile(plugin_file(plugin), target)
        os.chmod(target, file_mode)
        os.chmod(directory, dir_mode)
        if file_owner is not None:
            os.chown(target, file_owner, -1)
        if dir_owner is not None:
            os.chown(directory, dir_owner, -1)
        return str(target)

    return place_copy


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.mark.parametrize("layout, reason", [
    (dict(file_mode=0o664), "the file is writable by group or others (mode 0664)"),
    (dict(file_mode=0o646), "the file is writable by group or others (mode 0646)"),
    (dict(dir_mode=0o777), "is writable by group or others (mode 0777)"),
    (dict(dir_mode=0o775), "is writable by group or others (mode 0775)"),
    pytest.param(dict(file_owner=OTHER_UID), f"the file is owned by uid {OTHER_UID}", marks=needs_root),
    pytest.param(dict(dir_owner=OTHER_UID), f"is owned by uid {OTHER_UID}", marks=needs_root),
])
def test_untrusted_file_is_refused_and_nothing_changes(place, layout, reason):
    path = place(**layout)
    before = observable_state()
    with pytest.raises(max_device.UntrustedPluginError) as info:
        max_device.load_plugin(path)
    message = str(info.value)
    assert path in message and reason in message, message
    if "dir_mode" in layout or "dir_owner" in layout:
        assert f"its directory {os.path.dirname(path)}" in message
    assert "allow_untrusted=True" in message
    assert info.value.file == path
    assert isinstance(info.value, PermissionError)
    assert observable_state() == before


def test_sticky_world_writable_directory_is_trusted(place, load_plugin):
    plugin = load_plugin(place(dir_mode=0o1777))
    assert not plugin.allow_untrusted
    assert torch.neg(torch.ones(2, device="max_device")).cpu().tolist() == [-1.0, -1.0]


def test_opt_in_loads_an_untrusted_file_and_is_listed(place, load_plugin):
    plugin = load_plugin(place(file_mode=0o666, dir_mode=0o777), allow_untrusted=True)
    assert plugin.allow_untrusted
    assert [p.allow_untrusted for p in max_device.list_plugins()] == [True]


def test_symlink_is_judged_by_the_file_it_points_to(place, tmp_path):
    target = place(file_mode=0o666)
    link = tmp_path / "trusted_link.so"
    link.symlink_to(target)
    with pytest.raises(max_device.UntrustedPluginError, match=f"the file {target} is writable"):
        max_device.load_plugin(str(link))


def test_reload_from_an_untrusted_file_is_refused_and_the_current_version_serves(place, load_plugin):
    plugin = load_plugin(place())
    before = observable_state()
    with pytest.raises(max_device.UntrustedPluginError) as info:
        plugin.reload(place(plugin="reference_v2", file_mode=0o664))
    assert "plugin 'reference'" in str(info.value)
    assert info.value.plugin == "reference"
    assert observable_state() == before


def test_reload_keeps_the_opt_in_of_the_version_it_replaces(place, load_plugin):
    plugin = load_plugin(place(file_mode=0o664), allow_untrusted=True)
    untrusted_v2 = place(plugin="reference_v2", file_mode=0o664)
    assert plugin.reload(untrusted_v2).generation == 2
    with pytest.raises(max_device.UntrustedPluginError):
        plugin.reload(place(file_mode=0o664), allow_untrusted=False)
    assert plugin.generation == 2


def test_pinned_sha256_loads_matching_content(place, load_plugin):
    path = place()
    plugin = load_plugin(path, sha256=sha256_of(path).upper())
    assert plugin.sha256 == sha256_of(path)


def test_sha256_mismatch_is_refused_before_anything_is_opened(place):
    path = place()
    wrong = "0" * 64
    before = observable_state()
    with pytest.raises(max_device.HashMismatchError) as info:
        max_device.load_plugin(path, sha256=wrong)
    message = str(info.value)
    assert path in message and sha256_of(path) in message and wrong in message
    assert observable_state() == before  # the snapshot was removed too


def test_reload_with_a_mismatching_pin_keeps_the_current_version(place, load_plugin):
    plugin = load_plugin(place())
    v2 = place(plugin="reference_v2")
    before = observable_state()
    with pytest.raises(max_device.HashMismatchError, match="plugin 'reference'"):
        plugin.reload(v2, sha256=sha256_of(place()))
    assert observable_state() == before
    assert plugin.reload(v2, sha256=sha256_of(v2)).generation == 2


@pytest.mark.parametrize("pin", ["abc", "g" * 64, "0" * 63])
def test_malformed_pin_is_a_value_error(place, pin):
    with pytest.raises(ValueError, match="64 hexadecimal digits"):
        max_device.load_plugin(place(), sha256=pin)
