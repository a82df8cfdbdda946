"""Sharing max_device tensors between processes.

max_device memory is host RAM, so a max_device storage can live in POSIX
shared memory exactly as a CPU storage does: sharing one copies its bytes
once into a CPU shared-memory storage and re-seats the device storage on
that buffer (every view follows). torch.multiprocessing queues, DataLoader
workers and Tensor.share_memory_() then pass max_device tensors as CPU
ones pass: the receiver maps the same memory and wraps it as a max_device
tensor, no copy.

PyTorch treats every storage that is not on the CPU as device memory that
needs no moving (UntypedStorage.share_memory_ does nothing for them), and
its pickler calls CPU-only sharing functions on them, which fails in the
queue's feeder thread and leaves the receiver waiting forever. Hence the
max_device paths here.
"""

from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _torch_reductions

from . import _C

_DEVICE_TYPE = "max_device"


def _shared_host_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The shared-memory CPU storage under a max_device storage, created on first use."""
    host = _C._adopted_host_storage(storage)
    if host is not None and host.is_shared():
        return host
    shared = torch.UntypedStorage(storage.nbytes())
    if shared.nbytes():
        shared.share_memory_()
        shared.copy_(storage)
        _C._rehost(storage, shared)
    return shared


def _rebuild_tensor(host_storage, device_index, dtype, storage_offset, size, stride, requires_grad):
    host = torch.empty(0, dtype=dtype).set_(host_storage, storage_offset, size, stride)
    tensor = _C._adopt_host_tensor(host, device_index)
    tensor.requires_grad_(requires_grad)
    return tensor


def _rebuild_parameter(host_storage, device_index, dtype, storage_offset, size, stride, requires_grad):
    data = _rebuild_tensor(host_storage, device_index, dtype, storage_offset, size, stride, False)
    return torch.nn.Parameter(data, requires_grad=requires_grad)


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type != _DEVICE_TYPE:
        return _torch_reductions.reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
            "support crossing process boundaries; call detach() on the max_device tensor first")
    host = _shared_host_storage(tensor.untyped_storage())
    rebuild = _rebuild_parameter if isinstance(tensor, torch.nn.Parameter) else _rebuild_tensor
    # The CPU storage pickles through PyTorch's own reducer (fd or file name).
    return (rebuild, (host, tensor.device.index, tensor.dtype, tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()),
                      tensor.requires_grad))


def _rebuild_storage(host_storage, device_index):
    host = torch.empty(0, dtype=torch.uint8).set_(host_storage)
    return _C._adopt_host_tensor(host, device_index).untyped_storage()


def _reduce_storage(storage: torch.UntypedStorage):
    if storage.device.type != _DEVICE_TYPE:
        return _torch_reductions.reduce_storage(storage)
    return (_rebuild_storage, (_shared_host_storage(storage), storage.device.index))


def _share_memory_(self, *args, **kwargs):
    if self.device.type == _DEVICE_TYPE:
        _shared_host_storage(self)
        return self
    return _torch_share_memory_(self, *args, **kwargs)


def _is_shared(self):
    if self.device.type == _DEVICE_TYPE:
        host = _C._adopted_host_storage(self)
        return host is not None and host.is_shared()
    return _torch_is_shared(self)


_torch_share_memory_ = torch.UntypedStorage.share_memory_
_torch_is_shared = torch.UntypedStorage.is_shared


def install() -> None:
    """Route max_device tensors and storages through the paths above (once per process)."""
    if torch.UntypedStorage.share_memory_ is _share_memory_:
        return
    torch.UntypedStorage.share_memory_ = _share_memory_
    torch.UntypedStorage.is_shared = _is_shared
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reduce_tensor)
    # TypedStorage pickles its UntypedStorage, so this covers both.
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
