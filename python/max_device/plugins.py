"""Loading, listing, inspecting and unloading plugins.

Where plugin files come from: a path (anything containing a ``/``, such as
``./kernels.so``) is used as given. A bare name (``"reference"``) is looked
up only in the plugin search path: the directories given to
``set_plugin_path()`` first, then those of ``MAX_DEVICE_PLUGIN_PATH``
(colon-separated), in order; in each directory ``lib<name>.so`` then
``<name>.so`` (a name ending in ``.so`` is that file); then among the
plugins installed packages declare (``discovery.py``). Bare names are never
looked up in the current directory or ``LD_LIBRARY_PATH``.
"""

import dataclasses
import math
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from . import _C, discovery
from ._structured import derived_variants
from .errors import PluginNotFoundError, PluginStateError

PathArg = Union[str, bytes, os.PathLike]

PLUGIN_PATH_ENV = "MAX_DEVICE_PLUGIN_PATH"
_configured_plugin_path: List[str] = []


def set_plugin_path(directories: Iterable[Union[str, os.PathLike]]) -> None:
    """Set the directories searched, in order, for plugins loaded by bare
    name; they come before ``MAX_DEVICE_PLUGIN_PATH``. Each must be absolute
    (a relative one would depend on the current directory)."""
    chosen = [os.fspath(d) for d in directories]
    relative = [d for d in chosen if not os.path.isabs(d)]
    if relative:
        raise ValueError(f"plugin search path directories must be absolute: {relative}")
    _configured_plugin_path[:] = chosen


def plugin_path() -> List[str]:
    """The plugin search path in lookup order: ``set_plugin_path()``'s
    directories, then ``MAX_DEVICE_PLUGIN_PATH``'s."""
    return [directory for directory, _ in _search_path()]


def _search_path() -> List[Tuple[str, str]]:
    """(directory, where it was set) in lookup order. Empty and relative
    entries of the environment variable are skipped: an empty one would
    conventionally mean the current directory, a relative one depends on
    it."""
    entries = [(d, "set_plugin_path") for d in _configured_plugin_path]
    for directory in os.environ.get(PLUGIN_PATH_ENV, "").split(":"):
        if os.path.isabs(directory):
            entries.append((directory, PLUGIN_PATH_ENV))
        elif directory:
            _C._log("warn", f"{PLUGIN_PATH_ENV}: ignoring '{directory}', which is not an absolute path")
    return entries


def _path_text(path: PathArg) -> str:
    """A path argument as text: ``str``, ``bytes`` or ``os.PathLike``; bytes
    that are not UTF-8 become surrogate escapes, as ``os.fsdecode`` makes
    them (the loader gets the original bytes back). An embedded NUL is
    refused, as ``open()`` refuses it."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"expected a path (str, bytes or os.PathLike), got {type(path).__name__}: {path!r}")
    text = os.fsdecode(os.fspath(path))
    if "\0" in text:
        raise ValueError(f"embedded null byte in path {text!r}")
    if not text:
        raise ValueError("the path is empty")
    return text


def _resolve(path: PathArg) -> Tuple[str, str]:
    """(file, origin) for a path or a bare name; the origin is what
    ``Plugin.origin`` shows."""
    path = _path_text(path)
    if "/" in path:
        return path, "path"
    filenames = [path] if path.endswith(".so") else [f"lib{path}.so", f"{path}.so"]
    searched = _search_path()
    for directory, source in searched:
        for filename in filenames:
            candidate = os.path.join(directory, filename)
            if os.path.exists(candidate):
                return candidate, f"{source}: {directory}"
    installed = discovery.find(path)  # after the explicit search path
    if installed is not None:
        return installed.path, installed.origin
    where = ", ".join(f"{d} ({source})" for d, source in searched) or \
        f"nothing: it is empty (set_plugin_path() and {PLUGIN_PATH_ENV} are unset)"
    raise PluginNotFoundError(
        f"{path}: no {' or '.join(filenames)} in the plugin search path and no installed package declares it "
        f"({discovery.ENTRY_POINT_GROUP} entry points); searched {where}. Bare names are "
        f"never looked up in the current directory or LD_LIBRARY_PATH: write './{path}' for a file here",
        file=path)


def _pinned(sha256: Optional[str]) -> Optional[str]:
    if sha256 is None:
        return None
    if not isinstance(sha256, str):
        raise TypeError(f"sha256 must be a string of 64 hexadecimal digits, got {type(sha256).__name__}: "
                        f"{sha256!r}")
    digest = sha256.lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    return digest


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    op: str
    schema: str
    dtypes: int
    flags: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a plugin file declares, read without running any of its code."""

    name: str
    version: str
    abi: str
    kernels: List[KernelEntry]
    exported_symbols: List[str]

    def __str__(self) -> str:
        lines = [f"{self.name} {self.version} (plugin ABI {self.abi}), {len(self.kernels)} kernels"]
        from .testing import kernel_capabilities
        for k in self.kernels:
            caps = kernel_capabilities(k)
            declared = f"  [{','.join(caps['dtypes'])}" + (f"; {','.join(caps['flags'])}]" if caps["flags"] else "]")
            lines.append(f"  {k.op}{declared}" + (f"  defines: {k.schema}" if k.schema else ""))
        return "\n".join(lines)


class Plugin:
    """A handle on one load of a plugin, returned by ``load_plugin`` and
    ``get_plugin``. Its attributes read the live state of that load: after
    a reload (``reload_plugin``, ``Plugin.reload``, a ``watch()``) they show
    the version serving now. Once that load is unloaded, ``loaded`` is
    False, the attributes keep the last state seen, and changing the plugin
    through the handle raises ``PluginStateError``: a plugin loaded again
    under the same name is another load (``get_plugin(name)`` gives its
    handle).

    Attributes: ``name``; ``version`` (the plugin's own version string);
    ``path`` (the file the user gave); ``origin`` (``"path"``, or the search
    path entry that held it); ``snapshot`` (the private copy that is
    mapped); ``sha256``; ``abi`` (``"major.minor"`` it was built for);
    ``ops`` (every op it serves); ``defines`` (the ops it defined);
    ``generation`` (1 at load, +1 per published reload); ``load_seconds``
    (snapshot to publish, for this version); ``loaded_at`` (Unix time this
    version was published); ``previous_versions`` (older versions still
    mapped, rollback targets); ``calls_in_flight`` (kernel calls of this
    version running now); ``allow_untrusted``; ``allow_composite``;
    ``loaded``; ``id`` (this load, unique in the process)."""

    def __init__(self, info: dict):
        self._id = info["id"]
        self._last = info

    def _info(self) -> dict:
        live = _C._plugin_info(self._id)
        if live is not None:
            self._last = live
        return self._last

    id = property(lambda self: self._id, doc="this load of the plugin (a reload keeps it)")
    name = property(lambda self: self._last["name"])
    version = property(lambda self: self._info()["version"])
    path = property(lambda self: self._info()["path"], doc="the file the user loaded")
    origin = property(lambda self: self._info()["origin"],
                      doc="how the file was found: 'path', or the search path entry that held it")
    allow_untrusted = property(lambda self: self._info()["allow_untrusted"],
                               doc="loaded with the ownership and permission checks waived")
    allow_composite = property(lambda self: self._info()["allow_composite"],
                               doc="kernels on CompositeImplicitAutograd ops accepted (forward only)")
    snapshot = property(lambda self: self._info()["snapshot"], doc="the private copy that is mapped")
    sha256 = property(lambda self: self._info()["sha256"])
    abi = property(lambda self: self._info()["abi"])
    ops = property(lambda self: list(self._info()["ops"]))
    defines = property(lambda self: list(self._info()["defines"]), doc="ops this plugin defines")
    generation = property(lambda self: self._info()["generation"],
                          doc="1 at load, +1 for every reload that published a new version")
    load_seconds = property(lambda self: self._info()["load_duration_ns"] / 1e9,
                            doc="snapshot to publish, for this version")
    loaded_at = property(lambda self: self._info()["loaded_at_ns"] / 1e9,
                         doc="when this version was published (Unix time)")
    previous_versions = property(lambda self: self._info()["previous_versions"],
                                 doc="older versions still mapped (rollback targets)")
    calls_in_flight = property(lambda self: self._info()["calls_in_flight"],
                               doc="kernel calls of this version running now")

    @property
    def loaded(self) -> bool:
        """Whether this load is still loaded (a reload keeps it loaded)."""
        return _C._plugin_info(self._id) is not None

    def unload(self) -> dict:
        return unload_plugin(self)

    def reload(self, path: Optional[PathArg] = None, **options) -> "Plugin":
        """See reload_plugin(); returns this handle, which reads the new version."""
        reload_plugin(self, path, **options)
        return self

    def rollback(self) -> "Plugin":
        """See rollback_plugin(); returns this handle."""
        rollback_plugin(self)
        return self

    def __eq__(self, other) -> bool:
        return isinstance(other, Plugin) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        info = self._info()
        state = "" if self.loaded else ", unloaded"
        return (f"<max_device.Plugin {info['name']} {info['version']} gen {info['generation']} "
                f"({len(info['ops'])} ops, sha256 {info['sha256'][:12]}){state}>")


def _checks(path: str, plugin: str, reload: bool, validate: bool, isolate: bool, preflight: bool,
            timeout: float, samples=None, references=None, allow_composite: bool = False) -> dict:
    """The registry's checks for these options: a child process (isolate),
    a forked child (preflight), with the kernel comparison there if asked;
    else the comparison in this process before publish."""
    from . import validation
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isolate:
        return {"before_open": validation.isolated_check(path, plugin, validate, timeout, samples=samples,
                                                         references=references, allow_composite=allow_composite)}
    if preflight:
        return {"before_open": validation.preflight_check(path, plugin, reload, validate, timeout, samples=samples,
                                                          references=references)}
    if validate:
        return {"before_publish": validation.validate_in_process(path, plugin, samples=samples,
                                                                 references=references)}
    return {}


def _name_arg(name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}: {name!r}")
    if not name:
        raise ValueError("name must not be empty (omit it to use the plugin's own name)")
    return name


def load_plugin(path: PathArg, *, name: Optional[str] = None, sha256: Optional[str] = None,
                allow_untrusted: bool = False, validate: bool = False, isolate: bool = False,
                preflight: bool = False, timeout: float = 120.0, allow_composite: bool = False, samples=None,
                references=None) -> Plugin:
    """Load a plugin library and put its kernels on top of each op's stack.

    ``path`` is a file path (``str``, ``bytes`` or ``os.PathLike``), or a
    bare name looked up in the plugin search path (see the module
    docstring). A file that some process still holds open for writing (a
    linker that has not finished) is refused with ``PluginBusyError``. The file is copied to a private
    snapshot first; the snapshot is what is opened. Loading runs the
    plugin's constructors and init (``inspect`` runs nothing). All or
    nothing: on any error, raises a ``max_device.PluginError`` subclass and
    nothing changes. ``name`` registers the plugin under another name than
    its manifest's, e.g. to load two builds side by side.

    Trust: a file (or its directory) that another user owns or that group
    or others may write is refused (``UntrustedPluginError``) unless
    ``allow_untrusted=True``; a sticky directory such as /tmp is accepted.
    ``sha256`` pins the content: the hash of the very snapshot that would
    be opened must match, else ``HashMismatchError`` and nothing is opened.

    ``validate=True`` compares every kernel with the CPU on PyTorch's OpInfo
    samples before publishing and refuses the plugin on a mismatch
    (``ValidationError`` with a per-op report). ``isolate=True`` first opens
    the exact snapshot in a child process (``timeout`` seconds), so a plugin
    whose constructors or kernels crash or hang is refused while this
    process lives; with ``validate`` the comparison runs there too.
    ``preflight=True`` does the same in a fork of this process
    (milliseconds instead of seconds). ``timeout`` bounds either child.
    ``samples``/``references`` (dicts, or a samples file) check custom ops
    in ``validate``, as in ``testing.check_plugin``; with ``isolate`` too
    (a samples file's path, or functions the child imports by name: see
    ``max_device.validation``; a lambda raises ``TypeError``).

    A kernel on a CompositeImplicitAutograd op (``aten::softmax.int``) is
    refused (``SchemaError`` naming the overload to serve instead): PyTorch
    would run it for the forward and drop the gradients. ``allow_composite``
    accepts such kernels for forward-only use (a warning per op).
    """
    path, origin = _resolve(path)
    name = _name_arg(name)
    pinned = _pinned(sha256)
    checks = _checks(path, name or inspect(path).name, False, validate, isolate, preflight, timeout, samples,
                     references, allow_composite) if validate or isolate or preflight else {}
    info = _C._load_plugin(os.fsencode(path), name, origin=origin, sha256=pinned,
                           allow_untrusted=allow_untrusted, allow_composite=allow_composite, **checks)
    return Plugin(info)


def unload_plugin(plugin: Union[Plugin, str]) -> dict:
    """Remove a plugin's kernels (each op falls to the provider below) and
    release its library once no call is in flight. Ops the plugin defined
    stay defined (PyTorch cannot safely drop a schema Python may hold):
    calling one raises ``PluginStateError`` naming the unloaded plugin,
    until a plugin that serves it is loaded.

    Returns ``{"name": ..., "unmapped": bool}``; ``unmapped`` is False when
    the library could not leave the process (GNU unique symbols,
    thread_local destructors), which is also logged."""
    name, load_id = _target(plugin)
    return _C._unload_plugin(name, load_id)


def reload_plugin(plugin: Union[Plugin, str], path: Optional[PathArg] = None, *,
                  force: bool = False, sha256: Optional[str] = None, allow_untrusted: Optional[bool] = None,
                  validate: bool = False, isolate: bool = False, preflight: bool = False,
                  timeout: float = 120.0, allow_composite: Optional[bool] = None, samples=None,
                  references=None) -> Plugin:
    """Hot swap: load a new build of a loaded plugin and publish all its
    kernels in one atomic step.

    ``path`` defaults to the file the current version came from (rebuilt in
    place). Until the new version is published the current one serves every
    call; calls in flight finish on the version they started on. Unchanged
    content (same SHA-256) is a no-op unless ``force``. Ops the new version
    no longer serves fall to the provider below. On any error nothing
    changes and the current version keeps serving. The previous versions
    stay mapped for ``rollback_plugin``. ``validate``, ``isolate`` and
    ``preflight`` check the new version before it goes live, as in
    ``load_plugin``. ``path`` may be a bare name (search path), ``sha256``
    pins the new content, ``allow_untrusted`` and ``allow_composite``
    default to what the current version was loaded with, and
    ``samples``/``references`` are as in ``load_plugin``. A file still
    being written is refused with ``PluginBusyError``."""
    return _reload(plugin, path, force=force, sha256=sha256, allow_untrusted=allow_untrusted, validate=validate,
                   isolate=isolate, preflight=preflight, timeout=timeout, allow_composite=allow_composite,
                   samples=samples, references=references)


def _reload(plugin: Union[Plugin, str], path: Optional[PathArg] = None, *, last_check=None, force: bool = False,
            sha256: Optional[str] = None, allow_untrusted: Optional[bool] = None, validate: bool = False,
            isolate: bool = False, preflight: bool = False, timeout: float = 120.0,
            allow_composite: Optional[bool] = None, samples=None, references=None) -> Plugin:
    """reload_plugin; ``last_check(ops)``, if given, runs after every other
    check, right before publish (its exception refuses the new version)."""
    name, load_id = _target(plugin)
    path, origin = (None, None) if path is None else _resolve(path)
    pinned = _pinned(sha256)
    current = get_plugin(name) if validate or isolate or preflight else None
    checks = _checks(path or current.path, name, True, validate, isolate, preflight, timeout, samples, references,
                     current.allow_composite if allow_composite is None else allow_composite) \
        if current is not None else {}
    if last_check is not None:
        checks["before_publish"] = _then(checks.get("before_publish"), last_check)
    info = _C._reload_plugin(name, None if path is None else os.fsencode(path), force, origin=origin,
                             sha256=pinned, allow_untrusted=allow_untrusted, allow_composite=allow_composite,
                             id=load_id, **checks)
    return Plugin(info)


def _then(first, second):
    if first is None:
        return second

    def both(ops):
        first(ops)
        second(ops)
    return both


def rollback_plugin(plugin: Union[Plugin, str]) -> Plugin:
    """Return to the previous version (still mapped) in one atomic step."""
    return Plugin(_C._rollback_plugin(*_target(plugin)))


def _target(plugin: Union[Plugin, str]) -> Tuple[str, Optional[int]]:
    """(name, load id): a handle names one load; a string, whatever is
    loaded under that name."""
    if isinstance(plugin, Plugin):
        return plugin.name, plugin.id
    if not isinstance(plugin, str):
        raise TypeError(f"expected a Plugin or a plugin name, got {plugin!r}")
    return plugin, None


def list_plugins() -> List[Plugin]:
    return [Plugin(info) for info in _C._list_plugins()]


def get_plugin(name: str) -> Plugin:
    for info in _C._list_plugins():
        if info["name"] == name:
            return Plugin(info)
    raise PluginStateError(f"plugin '{name}': no plugin of this name is loaded", plugin=name)


def inspect(path: PathArg) -> Manifest:
    """Read a plugin file's manifest without loading it (a bare name is
    looked up in the plugin search path, as by ``load_plugin``)."""
    m = _C._inspect(os.fsencode(_resolve(path)[0]))
    return Manifest(m["name"], m["version"], m["abi"], [KernelEntry(**k) for k in m["kernels"]],
                    list(m["exported_symbols"]))


class OpTable(list):
    """``list_ops()``'s result: a list of dicts that prints as a table."""

    def __str__(self) -> str:
        rows = [("op", "active", "stack (bottom -> top)", "calls", "declines", "fallbacks")]
        for entry in self:
            layers = entry["layers"]
            stack = " < ".join(l["owner"] for l in layers) or "-"  # bottom < ... < top
            active = layers[-1]["owner"] if layers else "cpu fallback"
            op = entry["op"] + (f"  (via {entry['via']})" if entry.get("via") else "")
            if entry.get("via"):  # its calls are counted on the .out row
                rows.append((op, active, stack, "", "", ""))
                continue
            rows.append((op, active, stack, str(sum(l["calls"] for l in layers)),
                         str(sum(l["declines"] for l in layers)), str(entry["fallbacks"])))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def list_ops(*plugins: Union[Plugin, str]) -> OpTable:
    """Every op a plugin serves on max_device: its provider stack bottom to
    top (the top is active), call, decline and fallback counts, and its
    ``call_path``: ``"unboxed"`` when the dispatcher calls the loader with
    C++ arguments as it calls a native kernel (common signatures: unary,
    binary, alpha, scalar, reductions over dims, softmax, addmm, in their
    functional, in-place and out= forms), else ``"boxed"``. Structured
    variants served through a ``.out`` kernel (``add`` and ``add_`` through
    ``add.out``) are listed too, marked ``via``. With plugin arguments, only
    ops those plugins serve."""
    names = {p.name if isinstance(p, Plugin) else p for p in plugins}
    table = OpTable()
    entries = _C._list_ops()
    served = {e["op"] for e in entries}
    for entry in entries:
        owners = {l["owner"].split("@", 1)[0] for l in entry["layers"]}
        if names and not names & owners:
            continue
        entry["via"] = None
        table.append(entry)
        for variant in derived_variants(entry["op"]):
            if variant in served:
                continue  # it has its own provider stack
            table.append({"op": variant, "via": entry["op"], "layers": entry["layers"], "fallbacks": 0,
                          "call_path": entry["call_path"]})
    return table


def set_kernel_checks(enabled: bool) -> None:
    """Kernel checks, a debugging mode: every plugin call also verifies that
    its read-only inputs are unchanged and that the outputs it allocated have
    the shapes and dtypes of the op's meta kernel; a breach raises
    ``KernelError``. Costs a hash of the inputs and a meta call per call.
    Off by default; ``MAX_DEVICE_CHECK_KERNELS=1`` turns it on at startup."""
    _C._set_kernel_checks(bool(enabled))


def kernel_checks() -> bool:
    return _C._kernel_checks()
