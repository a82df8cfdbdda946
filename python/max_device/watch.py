"""Reload plugins when their files are rebuilt: the development loop.

    w = max_device.watch("build/plugins/")     # or one plugin file
    ...                                        # edit, rebuild: the process runs the new kernels
    w.stop()

The directory is watched with inotify (linkers rewrite in place, ``cp``
copies over, build systems rename into place: all are seen). Only what the
kernel reports as finished counts: a file written and closed, or renamed
into place. It is reloaded ``debounce`` seconds (default 0.2) after that,
once no process holds it open for writing and it did not change meanwhile;
a half-written file is never loaded. By default each new build first runs
in a fork of this process (``preflight=True``): a build whose constructors
or init crash, abort or hang is refused there, logged, and the current
version keeps serving. Only files of loaded plugins are considered (and,
with ``pattern``, files matching it, which are loaded when they are not
yet); everything else a build writes in the directory is ignored.
"""

import atexit
import fnmatch
import math
import os
import threading
import weakref
from typing import Any, Dict, List, Optional

from . import _C
from .errors import PluginBusyError, PluginError
from .plugins import PathArg, _path_text, list_plugins, load_plugin, reload_plugin

_live: "weakref.WeakSet[Watch]" = weakref.WeakSet()
DEFAULT_DEBOUNCE = 0.2


class Watch:
    """A running watch (also a context manager). ``events()`` lists what it
    did; ``stop()`` ends it."""

    def __init__(self, target: PathArg, debounce: float = DEFAULT_DEBOUNCE, *, pattern: Optional[str] = None,
                 preflight: bool = True, validate: bool = False, isolate: bool = False, timeout: float = 120.0,
                 samples=None, references=None):
        if isinstance(debounce, bool) or not isinstance(debounce, (int, float)) or not math.isfinite(debounce) \
                or not 0 <= debounce <= 60:
            raise ValueError(f"debounce must be a number of seconds from 0 to 60, got {debounce!r}")
        if pattern is not None and (not isinstance(pattern, str) or not pattern or "/" in pattern):
            raise ValueError(f"pattern must be a shell pattern for file names (e.g. 'lib*.so'), got {pattern!r}")
        self.target = _path_text(target)
        self.pattern = pattern
        if isolate and validate:  # refuse samples a fresh interpreter cannot receive now, not at each build
            from .validation import isolated_payload
            isolated_payload(samples, references, f"watch({self.target!r})")
        self._reload_options: Dict[str, Any] = dict(preflight=preflight and not isolate, validate=validate,
                                                    isolate=isolate, timeout=timeout, samples=samples,
                                                    references=references)
        self._events: List[dict] = []
        self._lock = threading.Lock()
        self._watcher = _C._Watcher(os.fsencode(self.target), float(debounce), pattern or "", self._on_ready)
        _live.add(self)

    def _record(self, **event) -> None:
        with self._lock:
            self._events.append(event)

    def _on_ready(self, path: str) -> bool:
        """A finished file (called on the watch's thread). Returns False to
        be called again after another debounce (the file is busy again)."""
        plugins = [p for p in list_plugins() if os.path.realpath(p.path) == path]
        try:
            if not plugins and self.pattern and fnmatch.fnmatch(os.path.basename(path), self.pattern):
                plugin = load_plugin(path, **self._reload_options)
                self._record(file=path, plugin=plugin.name, reloaded=True, version=plugin.version,
                             generation=plugin.generation, sha256=plugin.sha256,
                             message=f"loaded {plugin.name} {plugin.version}")
            for plugin in plugins:
                before = plugin.sha256, plugin.version
                reload_plugin(plugin, **self._reload_options)
                changed = plugin.sha256 != before[0]
                self._record(file=path, plugin=plugin.name, reloaded=changed, version=plugin.version,
                             generation=plugin.generation, sha256=plugin.sha256,
                             message=f"reloaded: {before[1]} -> {plugin.version} (generation {plugin.generation})"
                             if changed else "unchanged")
        except PluginBusyError:
            return False
        except PluginError as e:  # logged by the loader; the current version keeps serving
            self._record(file=path, plugin=e.plugin or "", reloaded=False, version=None, generation=None,
                         sha256=None, message=str(e))
        return True

    def events(self) -> List[dict]:
        """What happened so far, oldest first: {"file", "plugin", "reloaded",
        "version", "generation", "sha256", "message"} (reloaded False:
        refused, the message says why, or unchanged; version, generation
        and sha256 are those serving after the event, None if refused)."""
        with self._lock:
            return list(self._events)

    def stop(self) -> None:
        """End the watch; returns once no reload of it is running."""
        self._watcher.stop()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<max_device.Watch {self.target} ({len(self.events())} events)>"


def watch(target: PathArg, debounce: float = DEFAULT_DEBOUNCE, *, pattern: Optional[str] = None,
          preflight: bool = True, validate: bool = False, isolate: bool = False, timeout: float = 120.0,
          samples=None, references=None) -> Watch:
    """Watch a plugin file, or a directory of plugin files; returns a
    ``Watch`` (also a context manager) whose ``stop()`` ends it.

    ``debounce`` (seconds, default 0.2): how long a finished file must stay
    unchanged and closed before it is reloaded. ``pattern``: a shell glob
    on file names (``"lib*.so"``); matching files are considered too, and
    loaded if they are not yet. The gates are those of ``reload_plugin``:
    ``preflight`` (default True: the new build is opened in a fork of this
    process first), ``validate`` (compare its kernels with the CPU before
    publishing), ``isolate`` (the check in a fresh interpreter instead of
    a fork), ``timeout`` (seconds for a child), ``samples``/``references``
    (inputs and reference functions that validation checks custom ops with,
    as in ``testing.check_plugin``)."""
    return Watch(target, debounce, pattern=pattern, preflight=preflight, validate=validate, isolate=isolate,
                 timeout=timeout, samples=samples, references=references)


@atexit.register
def _stop_all() -> None:
    """Watches end before the interpreter does: their thread calls Python."""
    for w in list(_live):
        w.stop()
