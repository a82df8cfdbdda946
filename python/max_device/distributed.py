"""torch.distributed on max_device.

Importing max_device makes Gloo serve max_device tensors: ``init_process_group("gloo")``,
``"cpu:gloo,max_device:gloo"`` and ``init_process_group()`` (max_device's default backend
is Gloo) all work for them. Gloo reads and writes the device memory in place (a
loader kernel hands it CPU aliases of the same bytes, loader/dispatch/collectives.cpp).
"""

import math
from typing import Optional, Tuple

import torch
import torch.distributed as dist

_DEVICE_TYPE = "max_device"


def register_backend() -> None:
    """Gloo serves max_device, and is its default backend."""
    if not dist.is_available():
        return
    from torch.distributed.distributed_c10d import Backend
    gloo_devices = Backend.backend_capability[Backend.GLOO]
    if _DEVICE_TYPE not in gloo_devices:
        gloo_devices.append(_DEVICE_TYPE)
    Backend.default_device_backend_map.setdefault(_DEVICE_TYPE, Backend.GLOO)


def init_device_mesh(mesh_shape: Tuple[int, ...], *, mesh_dim_names: Optional[Tuple[str, ...]] = None):
    """torch.distributed.device_mesh.init_device_mesh for max_device: a
    DeviceMesh over the default process group's ranks (row-major).
    PyTorch's own refuses device types that are not all letters."""
    from torch.distributed.device_mesh import DeviceMesh
    ranks = torch.arange(math.prod(mesh_shape), dtype=torch.int).view(tuple(mesh_shape))
    return DeviceMesh(_DEVICE_TYPE, ranks, mesh_dim_names=mesh_dim_names)
