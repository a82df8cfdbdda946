"""Reload plugins when their files are rebuilt: the development loop.

    w = max_device.watch("build/plugins/")     # or one plugin file
    ...                                        # edit, rebuild: the process runs the new kernels
    w.stop()

The directory is watched with inotify (linkers rewrite in place, ``cp``
copies over, build systems rename into place: all are seen). A file is
reloaded once its size held still for ``debounce`` seconds and it reads as a
complete plugin; a half-written file is never loaded, and a broken build is
logged while the current version keeps serving. Only plugins already loaded
from the watched files are reloaded.
"""

import os
from typing import List, Union

from . import _C


class Watch:
    def __init__(self, target: Union[str, os.PathLike], debounce: float = 0.2):
        self.target = os.fspath(target)
        self._watcher = _C._Watcher(self.target, float(debounce))

    def events(self) -> List[dict]:
        """What happened so far: {"file", "plugin", "reloaded", "message"}."""
        return self._watcher.events()

    def stop(self) -> None:
        self._watcher.stop()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<max_device.Watch {self.target} ({len(self.events())} events)>"


def watch(target: Union[str, os.PathLike], debounce: float = 0.2) -> Watch:
    """Watch a plugin file or a directory of plugin files; returns a handle
    (also a context manager) whose ``stop()`` ends the watch."""
    return Watch(target, debounce)
