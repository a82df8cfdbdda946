// The kernels PyTorch needs natively from any device: factories, views,
// resizing, set_, copies and scalar reads. Everything else falls back to
// the CPU (dispatch/cpu_fallback.cpp) or is served by a plugin.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

#include <vector>

#include "device/allocator.h"
#include "device/host_alias.h"

namespace maxdev::device {
namespace {

void check_options(std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                   c10::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      layout.value_or(c10::kStrided) == c10::kStrided,
      "max_device supports only strided (dense) tensors; got layout ", *layout);
  if (device.has_value()) check_device_index(device->index());
  TORCH_CHECK_NOT_IMPLEMENTED(!c10::isQIntType(dtype) && dtype != c10::ScalarType::ComplexHalf,
                              "max_device does not support dtype ", dtype);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  const auto scalar_type = c10::dtype_or_default(dtype);
  check_options(layout, device, scalar_type);
  CurrentDeviceScope on(device.has_value() ? device->index() : -1);
  return at::detail::empty_generic(size, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   scalar_type, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/) {
  const auto scalar_type = c10::dtype_or_default(dtype);
  check_options(layout, device, scalar_type);
  CurrentDeviceScope on(device.has_value() ? device->index() : -1);
  return at::detail::empty_strided_generic(size, stride, &allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), scalar_type);
}

// set_() with no source: an empty storage from the device allocator.
at::Tensor& set_empty(at::Tensor& self) {
  CurrentDeviceScope on(self.device().index());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &allocator(), /*resizable=*/true);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(storage));
  self.unsafeGetTensorImpl()->set_sizes_contiguous({0});
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kDeviceType,
              "max_device: set_() needs a max_device storage; got one on ", source.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto nbytes = static_cast<int64_t>(source.nbytes());
  const auto numel = nbytes / static_cast<int64_t>(self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

// Copies between max_device and the CPU, or within max_device: both are
// host memory, so this is a CPU copy over aliases of the device side.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  HostAliasScope scope;
  at::Tensor src_cpu = is_device_tensor(self) ? scope.to_cpu(self) : self;
  at::Tensor dst_cpu = is_device_tensor(dst) ? scope.to_cpu(dst) : dst;
  TORCH_CHECK(src_cpu.device().is_cpu() && dst_cpu.device().is_cpu(),
              "max_device: cannot copy between ", self.device(), " and ", dst.device());
  dst_cpu.copy_(src_cpu, non_blocking);
  return dst;
}

// Resizing allocates on the tensor's own device. A refused resize (a
// storage in shared memory cannot grow) leaves the tensor's shape as it was;
// PyTorch's resize_ would already have changed it.
const at::Tensor& resize_on_device(const at::Tensor& self, c10::IntArrayRef size,
                                   std::optional<c10::MemoryFormat> memory_format) {
  CurrentDeviceScope on(self.device().index());
  const std::vector<int64_t> sizes = self.sizes().vec();
  const std::vector<int64_t> strides = self.strides().vec();
  const int64_t offset = self.storage_offset();
  try {
    return at::native::resize_(self, size, memory_format);
  } catch (...) {
    self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    throw;
  }
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_on_device(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  HostAliasScope scope;
  return at::native::_local_scalar_dense_cpu(scope.to_cpu(self));
}

// nn.Module.to() keeps each Parameter object, and so weights tied between
// modules, only when this allows `param.data = converted`. PyTorch's own
// answer lists only its in-tree dense backends; a max_device tensor is a
// plain strided TensorImpl over host memory, interchangeable with a CPU one.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense_host = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || is_device_tensor(t));
  };
  return dense_host(self) && dense_host(from);
}

}  // namespace
}  // namespace maxdev::device

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace maxdev::device;
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_on_device));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

// Copies keep the conjugate and negative bits of their operands: the host
// aliases carry them and the CPU copy resolves them. Without these
// fallthroughs the math-bit fallbacks would first materialize the source by
// cloning it, and a clone on max_device is a _copy_from again, forever.
// (Only backends outside CPU/CUDA reach _copy_from at all.)
#define MAXDEV_COPIES_KEEP_MATH_BITS(key)                                  \
  TORCH_LIBRARY_IMPL(aten, key, m) {                                       \
    m.impl("_copy_from", torch::CppFunction::makeFallthrough());           \
    m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough()); \
  }
MAXDEV_COPIES_KEEP_MATH_BITS(Conjugate)
MAXDEV_COPIES_KEEP_MATH_BITS(Negative)
