"""torch.compile on max_device.

max_device memory is host RAM, so Inductor's CPU code generation (C++
kernels compiled with the host compiler, a Python wrapper that calls them)
runs unchanged on max_device pointers. This module tells dynamo and Inductor
so: a dynamo device interface built on torch.max_device, CPU scheduling and
wrapper codegen registered for the device type, and a named backend
``torch.compile(backend="max_device")``.

What a compiled graph captures: Inductor's own fused kernels are C++ code
generated at compile time; a plugin swap does not change them. Ops Inductor
does not lower (extern kernels such as mm/addmm/bmm, fallbacks, plugin
custom ops) are called through the dispatcher at run time, so they reach
whatever plugin serves them then. ``invalidate()`` (torch._dynamo.reset())
drops every compiled graph so the next call recompiles.
"""

import os

import torch
from torch._dynamo import device_interface as _dynamo_devices

from ._device import (Event, Stream, _exchange_device, _maybe_exchange_device, _set_stream_by_id,
                      current_device, current_stream, device, device_count, get_raw_stream,
                      is_available, is_bf16_supported, memory_allocated, set_device, set_stream,
                      stream, synchronize)

BACKEND_NAME = "max_device"


class MaxDeviceInterface(_dynamo_devices.DeviceInterface):
    """What dynamo and Inductor ask of a device, answered by torch.max_device."""

    device = device
    Event = Event
    Stream = Stream

    class Worker:
        # Kernels run on the host: a compile worker needs no device runtime.
        @staticmethod
        def set_device(index: int) -> None:
            set_device(index)

        @staticmethod
        def current_device() -> int:
            return current_device()

        @staticmethod
        def get_device_properties(device=None):
            # Inductor sizes reduction splits by multi_processor_count: the
            # kernels run on the host's cores, as CpuInterface says for "cpu".
            return _dynamo_devices.CpuDeviceProperties(os.cpu_count() or 1)

    current_device = staticmethod(current_device)
    set_device = staticmethod(set_device)
    exchange_device = staticmethod(_exchange_device)
    maybe_exchange_device = staticmethod(_maybe_exchange_device)
    device_count = staticmethod(device_count)
    is_available = staticmethod(is_available)
    stream = staticmethod(stream)
    current_stream = staticmethod(current_stream)
    set_stream = staticmethod(set_stream)
    _set_stream_by_id = staticmethod(_set_stream_by_id)
    get_raw_stream = staticmethod(get_raw_stream)
    synchronize = staticmethod(synchronize)

    is_bf16_supported = staticmethod(is_bf16_supported)
    memory_allocated = staticmethod(memory_allocated)

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return ""  # as for "cpu": Inductor keys caches on it; the C++ kernels do not depend on it


def _wrapper_codegen_classes():
    """Inductor's Python wrapper, calling the generated C++ kernels directly
    (no stream, no launcher) as it does for "cpu", which it names by string."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

    class HostKernelCalls:
        def _generate_kernel_call_helper(self, kernel_name, call_args, *, triton=True, **kwargs):
            if triton:
                return super()._generate_kernel_call_helper(kernel_name, call_args, triton=triton, **kwargs)
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))

    class SubgraphWrapperCodegen(HostKernelCalls, SubgraphPythonWrapperCodegen):
        pass

    class WrapperCodegen(HostKernelCalls, PythonWrapperCodegen):
        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return SubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return WrapperCodegen()

    return WrapperCodegen


def _register_inductor_backend(device_type: str) -> None:
    from torch._inductor.codegen import common
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides

    common.register_backend_for_device(device_type, CppScheduling, _wrapper_codegen_classes())
    common.register_device_op_overrides(device_type, CpuDeviceOpOverrides())


def _inductor(gm, example_inputs, **kwargs):
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs, **kwargs)


def invalidate() -> None:
    """Drop every compiled graph (all devices): the next call of a compiled
    function recompiles, generating its kernels anew."""
    torch._dynamo.reset()


def register(device_type: str) -> None:
    """Make torch.compile work for `device_type` (max_device's name); idempotent."""
    _dynamo_devices.register_interface_for_device(device_type, MaxDeviceInterface)
    for index in range(device_count()):
        _dynamo_devices.register_interface_for_device(f"{device_type}:{index}", MaxDeviceInterface)
    _register_inductor_backend(device_type)
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(_inductor, name=BACKEND_NAME)

