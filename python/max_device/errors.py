"""Typed errors. Every message names the file, the plugin and the op where
there is one; the same facts are attributes (``file``, ``plugin``, ``op``).
A failed load or unload leaves every observable state as it was."""

from typing import Optional


class PluginError(RuntimeError):
    """Base of every max_device plugin error."""

    def __init__(self, message: str, *, file: Optional[str] = None, plugin: Optional[str] = None,
                 op: Optional[str] = None):
        super().__init__(message)
        self.file = file or None
        self.plugin = plugin or None
        self.op = op or None


class PluginNotFoundError(PluginError, FileNotFoundError):
    """The file is missing, unreadable, or not a regular file."""


class BadImageError(PluginError):
    """Not a loadable plugin: not an ELF shared library for this machine, no
    entry point, an invalid definition, or its init failed."""


class AbiMismatchError(PluginError):
    """Built against a plugin ABI this max_device does not accept."""


class ManifestError(PluginError):
    """The embedded manifest is missing, corrupt, or disagrees with the
    plugin's entry point."""


class SchemaError(PluginError):
    """An op name or schema the dispatcher refuses (unknown op, malformed or
    contradicting schema, reserved namespace, unpassable argument types)."""


class KernelError(PluginError):
    """A plugin kernel reported an error while running."""


class PluginStateError(PluginError):
    """A request that does not fit the current state (unknown plugin, a name
    already loaded, ...)."""


class UntrustedPluginError(PluginError, PermissionError):
    """The file or its directory is owned by another user than this
    process's (or root), or writable by group or others: someone else could
    change the code this process runs. ``allow_untrusted=True`` waives the
    check."""


class HashMismatchError(PluginError):
    """The file's content is not the SHA-256 pinned with ``sha256=``."""


_BY_KIND = {
    "not_found": PluginNotFoundError,
    "bad_image": BadImageError,
    "abi_mismatch": AbiMismatchError,
    "manifest": ManifestError,
    "schema": SchemaError,
    "state": PluginStateError,
    "untrusted": UntrustedPluginError,
    "hash_mismatch": HashMismatchError,
}


def _from_loader(kind: str, message: str, file: str, plugin: str, op: str) -> PluginError:
    """Called by the C++ loader to build the exception it raises."""
    return _BY_KIND.get(kind, PluginError)(message, file=file, plugin=plugin, op=op)


