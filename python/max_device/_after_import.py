"""Run a callback once a module has been imported, without importing it."""

import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; lets find_spec below reach the real finders
        spec = importlib.util.find_spec(fullname)
        exec_module = spec.loader.exec_module

        def exec_then_callback(module):
            exec_module(module)
            self.callback()

        spec.loader.exec_module = exec_then_callback
        return spec


def call_after_import(name: str, callback) -> None:
    """`callback()` now if module `name` is loaded, else right after its import."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
