"""max_device: compiled kernels plugged into a running PyTorch process.

``import max_device`` turns PyTorch's PrivateUse1 key into a device named
``max_device`` whose memory is host RAM. Ops without a max_device kernel run
PyTorch's CPU kernel on the same bytes (no copy); plugins loaded at runtime
serve ops with their own kernels.
"""

import torch

from . import _C  # registers the device with PyTorch (allocator, guard, hooks, kernels)
from ._device import register_device as _register_device
from .fallback import fallback_counts, fallback_policy, reset_fallback_counts, set_fallback_policy
from ._logging import log_level, set_log_level

DEVICE_NAME = "max_device"

_register_device(DEVICE_NAME)

__all__ = [
    "DEVICE_NAME",
    "fallback_counts",
    "fallback_policy",
    "log_level",
    "reset_fallback_counts",
    "set_fallback_policy",
    "set_log_level",
]
