"""max_device: compiled kernels plugged into a running PyTorch process.

``import max_device`` turns PyTorch's PrivateUse1 key into a device named
``max_device`` whose memory is host RAM. Ops without a max_device kernel run
PyTorch's CPU kernel on the same bytes (no copy); plugins loaded at runtime
serve ops with their own kernels::

    import torch, max_device
    plugin = max_device.load_plugin("build/plugins/libreference.so")
    x = torch.randn(1024, device="max_device")
    y = torch.relu(x) + x          # plugin kernels
    print(max_device.list_ops())   # who serves what
    max_device.unload_plugin(plugin)
"""

import torch

from . import _C  # registers the device with PyTorch (allocator, guard, hooks, kernels)
from . import _autograd_threads
from ._after_import import call_after_import as _call_after_import
from ._device import register_device as _register_device
from ._sharing import install as _install_sharing
from .distributed import register_backend as _register_distributed
from ._logging import log_level, set_log_level
from .errors import (AbiMismatchError, BadImageError, DistributedReloadError, HashMismatchError,
                     InconsistentPluginsError, KernelError, ManifestError, PluginBusyError, PluginError,
                     PluginNotFoundError, PluginStateError, SchemaError, SnapshotError, UntrustedPluginError)
from .discovery import InstalledPlugin, available_plugins
from .fallback import (fallback_counts, fallback_policy, install_registration_hooks as _install_registration_hooks,
                       reset_fallback_counts, set_fallback_policy)
from .overrides import Override, override, restore
from .validation import ValidationError
from .watch import Watch, watch
from .plugins import (Manifest, Plugin, get_plugin, inspect, kernel_checks, list_ops, list_plugins,
                      load_plugin, plugin_path, reload_plugin, rollback_plugin, set_kernel_checks,
                      set_plugin_path, unload_plugin)

DEVICE_NAME = "max_device"
ABI_VERSION = _C.ABI_VERSION

_register_device(DEVICE_NAME)
_autograd_threads.register(DEVICE_NAME, lambda: getattr(torch, DEVICE_NAME).device_count())
_install_sharing()
_register_distributed()
_install_registration_hooks()


def _register_compile():
    # torch.compile support (dynamo device interface, Inductor codegen, the
    # "max_device" backend), installed when torch.compile first imports dynamo.
    from .compile import register
    register(DEVICE_NAME)


_call_after_import("torch._dynamo", _register_compile)

__all__ = [
    "ABI_VERSION", "DEVICE_NAME",
    # plugins
    "InstalledPlugin", "Manifest", "Plugin", "available_plugins", "get_plugin", "inspect", "list_ops",
    "list_plugins", "load_plugin", "reload_plugin", "rollback_plugin", "unload_plugin", "plugin_path", "set_plugin_path",
    "kernel_checks", "set_kernel_checks",
    # overrides
    "Override", "override", "restore",
    # the development loop
    "Watch", "watch",
    # errors
    "AbiMismatchError", "BadImageError", "DistributedReloadError", "HashMismatchError", "InconsistentPluginsError",
    "KernelError", "ManifestError", "PluginBusyError", "PluginError", "PluginNotFoundError", "PluginStateError",
    "SchemaError", "SnapshotError", "UntrustedPluginError", "ValidationError",
    # fallback and logs
    "fallback_counts", "fallback_policy", "reset_fallback_counts", "set_fallback_policy",
    "log_level", "set_log_level",
]
