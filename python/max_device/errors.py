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
    """A plugin kernel reported an error while running, or a kernel or a
    Python override returned a result that breaks the op's contract."""


class PluginStateError(PluginError):
    """A request that does not fit the current state (unknown plugin, a name
    already loaded, a handle whose plugin was unloaded, a call of an op
    whose plugin was unloaded, ...)."""


class UntrustedPluginError(PluginError, PermissionError):
    """The file or its directory is owned by another user than this
    process's (or root), or writable by group or others: someone else could
    change the code this process runs. ``allow_untrusted=True`` waives the
    check."""


class HashMismatchError(PluginError):
    """The file's content is not the SHA-256 pinned with ``sha256=``."""


class PluginBusyError(PluginError):
    """The file is still being written: a process holds it open for
    writing (a linker that has not finished, a copy), or it changed while
    it was being copied. Nothing was loaded; try again once it is closed
    (``watch()`` waits for that by itself)."""


class SnapshotError(PluginError):
    """The private snapshot directory cannot be used: it cannot be created
    (a missing or read-only base directory), is not private, is on a
    noexec mount, or is full. The message names the directory;
    ``MAX_DEVICE_SNAPSHOT_DIR`` chooses another."""


class InconsistentPluginsError(PluginError):
    """The ranks of a process group do not serve the same plugins
    (``max_device.distributed.check_consistent``). ``differences`` maps each
    differing plugin to ``{rank: (version, sha256) or None}`` (None: not
    loaded there); ``ranks`` lists the ranks that differ from rank 0."""

    def __init__(self, message: str, *, differences: dict, ranks: list):
        super().__init__(message, plugin=next(iter(differences), None))
        self.differences = differences
        self.ranks = ranks


class DistributedReloadError(PluginError):
    """``max_device.distributed.reload_all`` did not publish anywhere: a
    rank refused the new version or did not answer. ``refusals`` maps each
    such rank to its reason; every rank keeps the version it had."""

    def __init__(self, message: str, *, refusals: dict, file: Optional[str] = None,
                 plugin: Optional[str] = None):
        super().__init__(message, file=file, plugin=plugin)
        self.refusals = refusals


_BY_KIND = {
    "not_found": PluginNotFoundError,
    "bad_image": BadImageError,
    "abi_mismatch": AbiMismatchError,
    "manifest": ManifestError,
    "schema": SchemaError,
    "state": PluginStateError,
    "untrusted": UntrustedPluginError,
    "hash_mismatch": HashMismatchError,
    "busy": PluginBusyError,
    "snapshot": SnapshotError,
}


def _from_loader(kind: str, message: str, file: str, plugin: str, op: str) -> PluginError:
    """Called by the C++ loader to build the exception it raises."""
    return _BY_KIND.get(kind, PluginError)(message, file=file, plugin=plugin, op=op)


