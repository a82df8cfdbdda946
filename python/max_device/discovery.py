"""Plugins installed as Python packages, found through entry points.

A plugin wheel (``python -m max_device wheel``, or ``max_device_add_plugin_wheel``
in CMake) declares its plugin file in the entry point group
``max_device.plugins``::

    [max_device.plugins]
    reference = max_device_plugin_reference:libreference.so

The name (``reference``) is what ``load_plugin("reference")`` takes; the
value is ``<package>:<file>``, the plugin file inside the installed package
directory. Finding plugins runs no code of theirs: the path comes from the
distribution's metadata. ``load_plugin`` looks at entry points only after the
explicit search path (``set_plugin_path``, ``MAX_DEVICE_PLUGIN_PATH``).

Before a plugin file is handed to the loader it must be a regular file inside
its package's directory (symlinks resolved) and have the SHA-256 the
package's RECORD lists for it (the file as installed); the loader's own
ownership and permission checks then apply to it like to any other file.
"""

import base64
import dataclasses
import hashlib
import importlib.metadata
import os
from typing import List, Optional

from .errors import HashMismatchError, PluginError, PluginNotFoundError

ENTRY_POINT_GROUP = "max_device.plugins"


@dataclasses.dataclass(frozen=True)
class InstalledPlugin:
    """A plugin declared by an installed package (``available_plugins()``)."""

    name: str
    package: str
    version: str
    path: Optional[str]
    problem: Optional[str] = None  # why it cannot be loaded; None when it can
    error: Optional[PluginError] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def origin(self) -> str:
        return f"entry point: {self.package} {self.version}"


def available_plugins() -> List[InstalledPlugin]:
    """Every plugin that installed packages declare (entry point group
    ``max_device.plugins``), sorted by name: name, package, version, path of
    the plugin file, and ``problem`` (None, or why it cannot be loaded)."""
    found = [_describe(ep) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    return sorted(found, key=lambda p: (p.name, p.package))


def find(name: str) -> Optional[InstalledPlugin]:
    """The installed plugin called ``name`` with its file checked, or None
    when no package declares it. Raises ``PluginNotFoundError`` for a
    declaration that points at no proper file, ``HashMismatchError`` when the
    file is not the one installed, ``PluginError`` when several packages
    declare the name."""
    matches = [p for p in available_plugins() if p.name == name]
    if not matches:
        return None
    if len(matches) > 1:
        which = "; ".join(f"{p.package} {p.version} ({p.path})" for p in matches)
        raise PluginError(f"plugin '{name}' is declared by {len(matches)} installed packages: {which}; "
                          f"load one by its path", plugin=name)
    plugin = matches[0]
    if plugin.error is not None:
        raise plugin.error
    return plugin


def _describe(ep: importlib.metadata.EntryPoint) -> InstalledPlugin:
    dist = ep.dist
    package, version = (dist.metadata["Name"], dist.version) if dist is not None else ("?", "?")
    path, error = None, None
    try:
        path = _plugin_file(ep, dist)
        _check_installed(path, ep, dist)
    except HashMismatchError as e:
        error = e
    except (ValueError, OSError) as e:
        error = PluginNotFoundError(f"plugin '{ep.name}' of package {package} {version}: {e}",
                                    file=path, plugin=ep.name)
    return InstalledPlugin(ep.name, package, version, path, None if error is None else str(error), error)


def _plugin_file(ep: importlib.metadata.EntryPoint, dist) -> str:
    module, sep, filename = ep.value.partition(":")
    if not sep or not module or not filename or dist is None:
        raise ValueError(f"entry point value {ep.value!r} is not '<package>:<plugin file>'")
    package_dir = os.path.realpath(dist.locate_file(module.replace(".", os.sep)))
    path = os.path.realpath(os.path.join(package_dir, filename))
    if os.path.dirname(path) != package_dir and not path.startswith(package_dir + os.sep):
        raise ValueError(f"{ep.value!r} points outside the package directory {package_dir}")
    if not os.path.isfile(path):
        raise ValueError(f"{path} (from {ep.value!r}) is not an installed file")
    return path


def _check_installed(path: str, ep: importlib.metadata.EntryPoint, dist) -> None:
    """The file must be listed in the package's RECORD with its SHA-256."""
    for record in dist.files or ():
        if os.path.realpath(record.locate()) != path:
            continue
        if record.hash is None or record.hash.mode != "sha256":
            raise ValueError(f"{path}: the package's RECORD lists no sha256 for it")
        expected = base64.urlsafe_b64decode(record.hash.value + "=" * (-len(record.hash.value) % 4)).hex()
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        actual = digest.hexdigest()
        if actual != expected:
            raise HashMismatchError(
                f"plugin '{ep.name}' ({path}): sha256 {actual} is not the {expected} that package "
                f"{dist.metadata['Name']} {dist.version} installed (the file changed after installation)",
                file=path, plugin=ep.name)
        return
    raise ValueError(f"{path} is not listed in the RECORD of package {dist.metadata['Name']}")
