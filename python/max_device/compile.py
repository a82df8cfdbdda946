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

Inductor's caches (FX graph, AOTAutograd) key on torch's own sources, not on
a device's codegen: ``register`` adds a digest of this module to
``torch.compiler.config.cache_key_tag``, so a cache filled by another
max_device version never serves its code here.
"""

import functools
import hashlib
import os

import torch

from ._device import (Event, Stream, _exchange_device, _maybe_exchange_device, _set_stream_by_id,
                      current_device, current_stream, device, device_count, get_raw_stream,
                      is_available, is_bf16_supported, memory_allocated, set_device, set_stream,
                      stream, synchronize)

BACKEND_NAME = "max_device"


@functools.cache
def dynamo_interface() -> type:
    """The dynamo DeviceInterface of max_device (built on first use: defining
    it imports dynamo, which max_device leaves to torch.compile)."""
    from torch._dynamo.device_interface import CpuDeviceProperties, DeviceInterface

    class MaxDeviceInterface(DeviceInterface):
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
                return CpuDeviceProperties(os.cpu_count() or 1)

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

    return MaxDeviceInterface


def profiled_kernel_call(name: str, kernel, *args) -> None:
    """A generated kernel's call while the profiler records: a range named
    after the kernel (Inductor's own CPU wrapper shows none)."""
    with torch._C._profiler._RecordFunctionFast(name):
        kernel(*args)


def _wrapper_codegen_class(device_type: str):
    """Inductor's Python wrapper, doing for max_device what it does for the
    device it names "cpu": the generated C++ kernels are called directly (no
    stream, no launcher), and buffers come from a direct allocator call
    (_C._empty_strided, as empty_strided_cpu) rather than torch.empty_strided
    (its argument parser and dispatch cost ~2 us per buffer). Each kernel
    call shows in profiler traces under the kernel's name; without a
    profiler that costs one module attribute test, as Inductor's own check
    around a compiled graph's call."""
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

    class HostCodegen:
        def _generate_kernel_call_helper(self, kernel_name, call_args, *, triton=True, **kwargs):
            if triton:
                return super()._generate_kernel_call_helper(kernel_name, call_args, triton=triton, **kwargs)
            profiled = self.wrap_kernel_call("max_device_profiled_call", [repr(kernel_name), kernel_name, *call_args])
            self.writeline(f"{self.wrap_kernel_call(kernel_name, call_args)} "
                           f"if not max_device_profiler._is_profiler_enabled else {profiled}")

        def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
            if device.type != device_type or config.test_configs.track_memory_lifecycle:
                return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            shape, stride = self.codegen_python_shape_tuple(shape), self.codegen_python_shape_tuple(stride)
            allocated = self.codegen_python_shape_tuple(allocation_shape) if allocation_shape is not None else shape
            line = f"{name} = empty_strided_max_device({allocated}, {stride}, {dtype})"
            return line if allocated == shape else f"{line}.as_strided({shape}, {stride})"

    class SubgraphWrapperCodegen(HostCodegen, SubgraphPythonWrapperCodegen):
        pass

    class WrapperCodegen(HostCodegen, PythonWrapperCodegen):
        def write_header(self) -> None:
            super().write_header()
            self.imports.writeline("import torch.autograd.profiler as max_device_profiler")
            self.imports.writeline("from max_device._C import _empty_strided as empty_strided_max_device")
            self.imports.writeline("from max_device.compile import profiled_kernel_call as max_device_profiled_call")

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return SubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return WrapperCodegen()

    return WrapperCodegen


# Inductor (2.13) tests device.type == "cpu" in about a hundred places; for
# max_device, whose kernels are the CPU's C++ kernels on host memory, these
# matter (the rest are for Triton, CUDA, AOT packaging, mkldnn weight
# prepacking under freezing, quantization, pinned memory, or max_autotune):
#   answered as for "cpu" here, because they change what runs or what it computes:
#   - utils.get_current_backend: any other device gets Triton
#   - scheduler.BaseSchedulerNode.is_cpu: fusion rewrites written for Triton
#   - ir.is_cpu: when a reused or heavy pointwise result is realized into a
#     buffer (realize_cpu_opcount_threshold, realize_cpu_acc_reads_threshold)
#   - lowering.use_two_step_variance: var_mean (layer norm) as two passes, not
#     Welford, below config.cpp.use_two_step_variance_threshold
#   - lowering.div_prim: division by a constant stays a division, not a
#     multiply by its reciprocal (precision, pytorch#157959)
#   - lowering.cat: always a ConcatKernel, never a pointwise cat (C++ does not
#     vectorize its index expressions)
#   - codegen/wrapper.py make_allocation: direct allocator call (_wrapper_codegen_class)
#   - cpp_utils.DEVICE_TO_ATEN: the C++ wrapper's device constant (cpp_wrapper)
#   left as they are (speed only, same values):
#   - lowering.cat of int8/uint8 inputs: a C++ kernel, where the CPU's calls ATen
#   - lowering.constant_pad_nd: pad-as-cat is skipped on the CPU
#   - decomposition.mm/bmm/addmm: vector-shaped products (a size-1 dim) are
#     decomposed into pointwise ops always, not only below 32 elements
#   - lowering.argmax/argmin of non-contiguous inputs: a copy, not logical indices
#   - scheduler's benchmark_fusion (off by default) and wrapper memory statistics
#   - fx_passes.pre_grad.fuse_fx: inference-only (no grad) graph rewrites run
#     for all-CPU inputs only
def _answer_as_cpu(device_type: str) -> None:
    """Questions Inductor answers by a "cpu" string test that decide how it
    generates code for max_device (see the list above): answered as for
    "cpu", since max_device nodes are CPU C++ kernels."""
    import torch._inductor.codegen.common
    import torch._inductor.ir
    import torch._inductor.kernel.mm_common
    import torch._inductor.scheduler
    import torch._inductor.utils
    from torch._inductor import config
    from torch._inductor.scheduler import BaseSchedulerNode
    from torch._inductor.virtualized import V

    backend_of = torch._inductor.utils.get_current_backend

    def get_current_backend(device_type_asked=None):
        asked = device_type_asked or V.graph.get_current_device_or_throw().type
        return config.cpu_backend if asked == device_type else backend_of(asked)

    # Rebound where Inductor imported the function by name.
    for module in (torch._inductor.utils, torch._inductor.codegen.common, torch._inductor.scheduler,
                   torch._inductor.kernel.mm_common):
        module.get_current_backend = get_current_backend

    cpu_test = BaseSchedulerNode.is_cpu

    def is_cpu(node) -> bool:
        device = node.get_device()
        return cpu_test(node) or (device is not None and device.type == device_type)

    BaseSchedulerNode.is_cpu = is_cpu

    ir_is_cpu = torch._inductor.ir.is_cpu
    torch._inductor.ir.is_cpu = lambda x: ir_is_cpu(x) or torch._inductor.ir.get_device_type(x) == device_type
    _lower_as_on_cpu(device_type)


def _lower_as_on_cpu(device_type: str) -> None:
    """The lowerings whose "cpu" test changes what a kernel computes or which
    kernels there are."""
    from torch._inductor import config, lowering
    from torch._inductor.virtualized import ops

    def on_device(x) -> bool:
        device = x.get_device()
        return device is not None and device.type == device_type

    def replace_lowering(registered, replacement, **options):
        """Registers `replacement` for every op `registered` lowers (with
        the same broadcasting and promotion options); returns it wrapped."""
        ops = [op for op, fn in lowering.lowerings.items() if fn is registered]
        return lowering.register_lowering(ops, **options)(replacement)

    two_step_variance = lowering.use_two_step_variance

    def use_two_step_variance(x, axis, keepdim, input_dtype):
        if not on_device(x):
            return two_step_variance(x, axis, keepdim, input_dtype)
        # The CPU's rule is the generic one with the C++ backend's threshold.
        with config.patch(unroll_reductions_threshold=config.cpp.use_two_step_variance_threshold):
            return two_step_variance(x, axis, keepdim, input_dtype)

    lowering.use_two_step_variance = use_two_step_variance

    div_prim = lowering.div_prim.__wrapped__  # registered with broadcasting and promotion around it

    def div_by_constant_as_on_cpu(a, b):
        integral = all(lowering.is_boolean_type(x) or lowering.is_integer_type(x) for x in (a, b))
        if integral or lowering.get_constant_value(b) is None or not on_device(a):
            return div_prim(a, b)
        return lowering.make_pointwise(lambda x, y: ops.truediv(x, y))(a, b)

    lowering.div_prim = replace_lowering(lowering.div_prim, div_by_constant_as_on_cpu, broadcast=True)

    cat = lowering.cat.__wrapped__

    def cat_as_on_cpu(inputs, dim=0):
        if not on_device(inputs[0]):
            return cat(inputs, dim)
        with config.patch(max_pointwise_cat_inputs=0, max_complex_pointwise_cat_inputs=0):
            return cat(inputs, dim)

    lowering.cat = replace_lowering(lowering.cat, cat_as_on_cpu)


def _cpp_wrapper_codegen_class(device_type: str):
    """Inductor's C++ wrapper for the CPU (cpp_wrapper=True), with the CPU's
    headers for max_device. It serves graphs of generated kernels only: the
    C++ wrapper calls every op it does not generate (mm, addmm, bmm, ATen
    fallbacks) through a C shim per device type (aoti_torch_<device>_<op>),
    which PyTorch 2.13 ships for cpu/cuda/xpu/mps only, and the CPU's call the
    CPU kernels directly: past the dispatcher, so past max_device's plugins.
    Such a graph is refused with a NotImplementedError naming the op."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    class CppWrapperCodegen(CppWrapperCpu):
        def add_device_include(self, device: str) -> None:
            super().add_device_include("cpu" if device == device_type else device)

        def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs):
            if device == device_type:
                raise NotImplementedError(
                    f"max_device: torch._inductor.config.cpp_wrapper=True cannot call {kernel} on {device_type}: "
                    f"PyTorch 2.13's C++ wrapper calls ops it does not generate through per-device C shims "
                    f"(aoti_torch_<device>_<op>), which exist for cpu/cuda/xpu/mps only (the CPU's bypass the "
                    f"dispatcher, and so max_device's plugins). Compile with cpp_wrapper=False (the default).")
            super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            return CppWrapperCodegen()

    return CppWrapperCodegen


@functools.cache
def inductor_codegen(device_type: str) -> dict:
    """What Inductor's init_backend_registration() reads from a PrivateUse1
    device module (torch.max_device.Scheduling, ...): the CPU's C++ codegen.
    Asked for while Inductor compiles, so importing its codegen here is safe."""
    from torch._inductor.codegen.common import register_device_op_overrides
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_utils import DEVICE_TO_ATEN
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

    register_device_op_overrides(device_type, CpuDeviceOpOverrides())
    DEVICE_TO_ATEN[device_type] = "at::kPrivateUse1"  # the C++ wrapper's device constant
    _answer_as_cpu(device_type)
    return {"Scheduling": CppScheduling, "PythonWrapperCodegen": _wrapper_codegen_class(device_type),
            "CppWrapperCodegen": _cpp_wrapper_codegen_class(device_type), "WrapperFxCodegen": WrapperFxCodegen}


def _inductor(gm, example_inputs, **kwargs):
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs, **kwargs)


def invalidate() -> None:
    """Drop every compiled graph (all devices): the next call of a compiled
    function recompiles, generating its kernels anew."""
    torch._dynamo.reset()


@functools.cache
def codegen_cache_tag() -> str:
    """"max_device-codegen-<digest of this module>", part of every Inductor
    cache key in this process."""
    with open(__file__, "rb") as f:
        return f"max_device-codegen-{hashlib.sha256(f.read()).hexdigest()[:16]}"


def register(device_type: str) -> None:
    """Register `device_type` (max_device's name) with dynamo and as a
    torch.compile backend; idempotent. Inductor finds its codegen through the
    device module (inductor_codegen)."""
    tags = torch.compiler.config.cache_key_tag.split()  # the user's own tag stays
    if codegen_cache_tag() not in tags:
        torch.compiler.config.cache_key_tag = " ".join([*tags, codegen_cache_tag()])
    from torch._dynamo.device_interface import register_interface_for_device
    for name in (device_type, *(f"{device_type}:{i}" for i in range(device_count()))):
        register_interface_for_device(name, dynamo_interface())
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(_inductor, name=BACKEND_NAME)

