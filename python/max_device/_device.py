"""The torch.max_device device module and the rename of PrivateUse1."""

import types

import torch

from . import _C


def _check_index(device) -> None:
    index = device
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        if device.type != torch._C._get_privateuse1_backend_name():
            raise ValueError(f"expected a max_device device, got {device}")
        index = device.index
    if index not in (None, 0):
        raise IndexError(f"max_device has a single device, max_device:0; got index {index}")


def _make_module(name: str) -> types.ModuleType:
    module = types.ModuleType(f"torch.{name}", "max_device device module: host memory, one device.")

    def is_available() -> bool:
        return True

    def device_count() -> int:
        return 1

    def current_device() -> int:
        return 0

    def set_device(device) -> None:
        _check_index(device)

    def synchronize(device=None) -> None:
        """Kernels run synchronously; there is nothing to wait for."""
        if device is not None:
            _check_index(device)

    def _is_in_bad_fork() -> bool:
        return False

    def manual_seed(seed: int) -> None:
        _C._default_generator().manual_seed(int(seed))

    def seed() -> None:
        _C._default_generator().seed()

    def initial_seed() -> int:
        return _C._default_generator().initial_seed()

    def get_rng_state(device="max_device") -> torch.Tensor:
        _check_index(device)
        return _C._default_generator().get_state()

    def set_rng_state(new_state: torch.Tensor, device="max_device") -> None:
        _check_index(device)
        _C._default_generator().set_state(new_state)

    def memory_stats(device=None) -> dict:
        """Allocator statistics: bytes now and at peak, allocation counts."""
        if device is not None:
            _check_index(device)
        return _C._memory_stats()

    def memory_allocated(device=None) -> int:
        return memory_stats(device)["allocated_bytes"]

    def max_memory_allocated(device=None) -> int:
        return memory_stats(device)["peak_allocated_bytes"]

    def reset_peak_memory_stats(device=None) -> None:
        if device is not None:
            _check_index(device)
        _C._reset_peak_memory_stats()

    for fn in (is_available, device_count, current_device, set_device, synchronize,
               _is_in_bad_fork, manual_seed, seed, initial_seed, get_rng_state, set_rng_state,
               memory_stats, memory_allocated, max_memory_allocated, reset_peak_memory_stats):
        setattr(module, fn.__name__, fn)
    module.manual_seed_all = manual_seed
    module.default_generator = _C._default_generator()
    return module


def register_device(name: str) -> None:
    """Rename PrivateUse1 and install torch.<name>; idempotent."""
    current = torch._C._get_privateuse1_backend_name()
    if current == name and hasattr(torch, name):
        return
    if current != "privateuseone":
        raise RuntimeError(
            f"PrivateUse1 is already registered as '{current}' in this process; "
            f"max_device cannot claim it (a process can rename it once)")
    torch.utils.rename_privateuse1_backend(name)
    torch._register_device_module(name, _make_module(name))
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
