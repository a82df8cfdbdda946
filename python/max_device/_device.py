"""The torch.max_device device module and the rename of PrivateUse1.

torch.max_device holds what PyTorch's generic code asks of a device module
(serialization, FakeTensor, autocast, checkpoint, fork_rng, DataLoader,
torch._dynamo's device interface): device selection, streams and events,
random state, memory statistics and autocast dtypes. max_device has
MAX_DEVICE_COUNT devices (1..16, default 2), all host memory, whose kernels
run synchronously.
"""

import functools
import os
import types

import torch

from . import _C


def _device_count_from_environment() -> int:
    """MAX_DEVICE_COUNT, checked here so a bad value fails the import clearly
    (the C++ side, which reads it too, only ignores a bad value)."""
    value = os.environ.get("MAX_DEVICE_COUNT", "")
    if value == "":
        return _C._device_count()
    if not value.isdigit() or not 1 <= int(value) <= _C._MAX_DEVICE_COUNT:
        raise ValueError(f"MAX_DEVICE_COUNT must be a whole number from 1 to {_C._MAX_DEVICE_COUNT}, "
                         f"got {value!r}")
    return _C._device_count()


_DEVICE_COUNT = _device_count_from_environment()


def _index_of(device, *, optional: bool = True) -> int:
    """The device index of `device` (int, str, torch.device or None = current)."""
    if device is None and optional:
        return current_device()
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        if device.type != torch._C._get_privateuse1_backend_name():
            raise ValueError(f"expected a max_device device, got {device}")
        index = current_device() if device.index is None else device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"expected a max_device device or index, got {device!r}")
    if not 0 <= index < _DEVICE_COUNT:
        raise RuntimeError(
            f"max_device:{index} does not exist: invalid device ordinal (max_device has {_DEVICE_COUNT} "
            f"devices, max_device:0 to max_device:{_DEVICE_COUNT - 1}; MAX_DEVICE_COUNT sets how many)")
    return index


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    """The device needs no initialization: it is ready once max_device is imported."""
    return True


def init() -> None:
    """Nothing to do (see is_initialized); present because PyTorch calls it."""


def device_count() -> int:
    return _DEVICE_COUNT


def current_device() -> int:
    return torch._C._accelerator_getDeviceIndex()


def set_device(device) -> None:
    torch._C._accelerator_setDeviceIndex(_index_of(device, optional=False))


def _exchange_device(index: int) -> int:
    if index < 0:
        return -1
    return torch._C._accelerator_exchangeDevice(_index_of(index))


def _maybe_exchange_device(index: int) -> int:
    if index < 0:
        return -1
    return torch._C._accelerator_maybeExchangeDevice(_index_of(index))


class device:
    """Context manager that makes `device` the current max_device device."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index_of(device, optional=False)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _exchange_device(self.idx)

    def __exit__(self, *exc_info):
        self.idx = _maybe_exchange_device(self.prev_idx)
        return False


def synchronize(device=None) -> None:
    """Kernels run synchronously; this only checks the device."""
    torch._C._accelerator_synchronizeDevice(_index_of(device))


def get_device_capability(device=None) -> dict:
    return torch._C._accelerator_getDeviceCapability(_index_of(device))


def get_device_properties(device=None):
    _index_of(device)
    return types.SimpleNamespace(name="max_device (host memory)", type="max_device",
                                 total_memory=get_memory_info(device)[1])


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_amp_supported_dtype() -> list:
    """Dtypes torch.autocast(device_type="max_device") accepts: the CPU kernels run both."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


# --- streams and events (see loader/device/streams.h) ---------------------

class Stream(torch.Stream):
    """A max_device stream: real ids and priorities; work on it is synchronous."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # Stream(stream_id=..., device_index=..., device_type=...)
            return super().__new__(cls, priority=priority, **kwargs)
        index = _index_of(device)
        return super().__new__(cls, device=torch.device("max_device", index), priority=priority)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id)

    @staticmethod
    def priority_range() -> tuple:
        """(lowest, highest) priority, as torch.cuda.Stream.priority_range()."""
        return _C._STREAM_PRIORITY_RANGE


class Event(torch.Event):
    """A max_device event: recorded with a host timestamp, complete at once.

    Constructing one returns a plain torch.Event on max_device: PyTorch's
    event methods accept only that exact type as the other event.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return torch.Event(device="max_device", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device=None) -> Stream:
    s = torch._C._accelerator_getStream(_index_of(device))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device=None) -> Stream:
    current = torch._C._accelerator_getStream(_index_of(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch._C._accelerator_setStream(stream)


def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
    set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))


def get_raw_stream(device_index: int) -> int:
    return current_stream(device_index).stream_id


class StreamContext:
    """Makes `stream` current (and its device) inside the block; None does nothing."""

    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc_info):
        if self.stream is not None:
            set_stream(self.previous)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)


# --- random state ---------------------------------------------------------

def _generator(device=None) -> torch.Generator:
    return _C._default_generator(_index_of(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(_DEVICE_COUNT):
        _generator(index).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for index in range(_DEVICE_COUNT):
        _generator(index).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state(index) for index in range(_DEVICE_COUNT)]


def set_rng_state_all(new_states) -> None:
    states = list(new_states)
    if len(states) != _DEVICE_COUNT:
        raise ValueError(f"expected {_DEVICE_COUNT} rng states (one per device), got {len(states)}")
    for index, state in enumerate(states):
        set_rng_state(state, index)


# --- memory (torch.accelerator's allocator interface) ---------------------

def memory_stats(device=None) -> dict:
    """Allocator statistics of one device: bytes now and at peak, allocation counts."""
    return _C._memory_stats(_index_of(device))


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index_of(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index_of(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_index_of(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_index_of(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index_of(device))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index_of(device))


def empty_cache() -> None:
    """Nothing is cached: freed memory returns to the C library at once."""
    torch.accelerator.empty_cache()


def get_memory_info(device=None) -> tuple:
    """(free, total) bytes of host RAM, which max_device allocates from."""
    return torch.accelerator.get_memory_info(_index_of(device))


mem_get_info = get_memory_info

_MODULE_FUNCTIONS = (
    is_available, is_initialized, init, device_count, current_device, set_device, _exchange_device,
    _maybe_exchange_device, synchronize, get_device_capability, get_device_properties, get_device_name,
    get_amp_supported_dtype, is_bf16_supported, _is_in_bad_fork,
    current_stream, default_stream, set_stream, _set_stream_by_id, get_raw_stream, stream,
    manual_seed, manual_seed_all, seed, seed_all, initial_seed, get_rng_state, set_rng_state,
    get_rng_state_all, set_rng_state_all,
    memory_stats, memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
    reset_peak_memory_stats, reset_accumulated_memory_stats, empty_cache, get_memory_info,
)


def _make_module(name: str) -> types.ModuleType:
    module = types.ModuleType(f"torch.{name}", "max_device device module: host memory, synchronous kernels.")
    for fn in _MODULE_FUNCTIONS:
        setattr(module, fn.__name__, fn)
    for cls in (device, Stream, Event, StreamContext):
        setattr(module, cls.__name__, cls)
    module.mem_get_info = get_memory_info
    module.default_generators = tuple(_C._default_generator(i) for i in range(_DEVICE_COUNT))
    module.default_generator = module.default_generators[0]
    module._initialized = True  # torch.utils.checkpoint stashes device RNG state only if set
    module.__getattr__ = functools.partial(_inductor_codegen, name)
    return module


def _inductor_codegen(device_type: str, attribute: str):
    """torch.<name>.Scheduling and the wrapper codegens Inductor asks for,
    imported only then (see compile.py)."""
    if attribute in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        from .compile import inductor_codegen
        return inductor_codegen(device_type)[attribute]
    raise AttributeError(f"module 'torch.{device_type}' has no attribute '{attribute}'")


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
