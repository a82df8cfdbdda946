// Freezes the binary layout of the plugin ABI (plugin_api/include/max_device/plugin.h).
//
// The static_asserts below pin every field offset and size of every ABI struct
// on x86_64 (LP64): a change that would break plugins built against an older
// header does not compile. A new minor version appends fields and adds asserts
// for them here; existing lines never change (see plugin_api/CHANGELOG.md).
//
// The tests check that maxdev_tensor / maxdev_device / maxdev_dtype have the
// layout of DLPack's DLTensor / DLDevice / DLDataType as PyTorch ships it
// (ATen/dlpack.h, from the torch include directory; no libtorch link).
#include <max_device/plugin.h>

#include <ATen/dlpack.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// FROZEN(T, f, offset, size): field f of T lies at `offset` and is `size` bytes.
#define FROZEN(T, f, off, size)                                              \
  static_assert(offsetof(T, f) == (off), #T "." #f ": offset changed");      \
  static_assert(sizeof(static_cast<T*>(nullptr)->f) == (size),               \
                #T "." #f ": size changed")

#if defined(__x86_64__) && defined(__LP64__)

// --- versions and constants ------------------------------------------------
static_assert(MAXDEV_ABI_MAJOR == 1, "ABI major changed: old plugins stop loading");
static_assert(MAXDEV_ABI_MINOR >= 0, "ABI minor only grows");
static_assert(MAXDEV_OK == 0 && MAXDEV_DECLINED == 1 && MAXDEV_ERROR == 2, "status codes");
static_assert(sizeof(maxdev_status) == 4, "maxdev_status size");
static_assert(MAXDEV_DEVICE_CPU == 1 && MAXDEV_DEVICE_MAX == 12, "device types");
static_assert(MAXDEV_TYPE_INT == 0 && MAXDEV_TYPE_UINT == 1 && MAXDEV_TYPE_FLOAT == 2 &&
                  MAXDEV_TYPE_BFLOAT == 4 && MAXDEV_TYPE_COMPLEX == 5 && MAXDEV_TYPE_BOOL == 6,
              "type codes");
static_assert(MAXDEV_VALUE_NONE == 0 && MAXDEV_VALUE_TENSOR == 1 && MAXDEV_VALUE_INT == 2 &&
                  MAXDEV_VALUE_FLOAT == 3 && MAXDEV_VALUE_BOOL == 4 &&
                  MAXDEV_VALUE_INT_LIST == 5 && MAXDEV_VALUE_TENSOR_LIST == 6 &&
                  MAXDEV_VALUE_STRING == 7 && MAXDEV_VALUE_DTYPE == 8 &&
                  MAXDEV_VALUE_FLOAT_LIST == 9 && MAXDEV_VALUE_BOOL_LIST == 10,
              "value kinds");
static_assert(MAXDEV_VALUE_FLAG_SCALAR == 1u, "value flags");
static_assert(MAXDEV_DTYPE_BOOL == (1ull << 0) && MAXDEV_DTYPE_UINT8 == (1ull << 1) &&
                  MAXDEV_DTYPE_INT8 == (1ull << 2) && MAXDEV_DTYPE_INT16 == (1ull << 3) &&
                  MAXDEV_DTYPE_INT32 == (1ull << 4) && MAXDEV_DTYPE_INT64 == (1ull << 5) &&
                  MAXDEV_DTYPE_FLOAT16 == (1ull << 6) && MAXDEV_DTYPE_BFLOAT16 == (1ull << 7) &&
                  MAXDEV_DTYPE_FLOAT32 == (1ull << 8) && MAXDEV_DTYPE_FLOAT64 == (1ull << 9) &&
                  MAXDEV_DTYPE_COMPLEX64 == (1ull << 10) &&
                  MAXDEV_DTYPE_COMPLEX128 == (1ull << 11),
              "dtype mask bits");
static_assert(MAXDEV_KERNEL_CONTIGUOUS_ONLY == 1ull && MAXDEV_KERNEL_SAME_DTYPE == 2ull &&
                  MAXDEV_KERNEL_NO_CPU_TENSORS == 4ull,
              "kernel flags");
static_assert(MAXDEV_LOG_TRACE == 0 && MAXDEV_LOG_DEBUG == 1 && MAXDEV_LOG_INFO == 2 &&
                  MAXDEV_LOG_WARN == 3 && MAXDEV_LOG_ERROR == 4,
              "log levels");
static_assert(MAXDEV_MANIFEST_MAGIC == 0x4d44584du && MAXDEV_MANIFEST_PLUGIN == 1u &&
                  MAXDEV_MANIFEST_KERNEL == 2u && MAXDEV_MANIFEST_NAME_SIZE == 128 &&
                  MAXDEV_MANIFEST_TEXT_SIZE == 512,
              "manifest constants");

// --- maxdev_device ---------------------------------------------------------
static_assert(sizeof(maxdev_device) == 8 && alignof(maxdev_device) == 4, "maxdev_device");
FROZEN(maxdev_device, device_type, 0, 4);
FROZEN(maxdev_device, device_id, 4, 4);

// --- maxdev_dtype ----------------------------------------------------------
static_assert(sizeof(maxdev_dtype) == 4 && alignof(maxdev_dtype) == 2, "maxdev_dtype");
FROZEN(maxdev_dtype, code, 0, 1);
FROZEN(maxdev_dtype, bits, 1, 1);
FROZEN(maxdev_dtype, lanes, 2, 2);

// --- maxdev_tensor ---------------------------------------------------------
static_assert(sizeof(maxdev_tensor) == 48 && alignof(maxdev_tensor) == 8, "maxdev_tensor");
FROZEN(maxdev_tensor, data, 0, 8);
FROZEN(maxdev_tensor, device, 8, 8);
FROZEN(maxdev_tensor, ndim, 16, 4);
FROZEN(maxdev_tensor, dtype, 20, 4);
FROZEN(maxdev_tensor, shape, 24, 8);
FROZEN(maxdev_tensor, strides, 32, 8);
FROZEN(maxdev_tensor, byte_offset, 40, 8);

// --- maxdev_value ----------------------------------------------------------
static_assert(sizeof(maxdev_value) == 24 && alignof(maxdev_value) == 8, "maxdev_value");
FROZEN(maxdev_value, kind, 0, 4);
FROZEN(maxdev_value, flags, 4, 4);
FROZEN(maxdev_value, u, 8, 16);
FROZEN(maxdev_value, u.tensor, 8, 8);
FROZEN(maxdev_value, u.i, 8, 8);
FROZEN(maxdev_value, u.f, 8, 8);
FROZEN(maxdev_value, u.b, 8, 4);
FROZEN(maxdev_value, u.string, 8, 8);
FROZEN(maxdev_value, u.dtype, 8, 4);
FROZEN(maxdev_value, u.int_list, 8, 16);
FROZEN(maxdev_value, u.int_list.data, 8, 8);
FROZEN(maxdev_value, u.int_list.size, 16, 8);
FROZEN(maxdev_value, u.float_list, 8, 16);
FROZEN(maxdev_value, u.float_list.data, 8, 8);
FROZEN(maxdev_value, u.float_list.size, 16, 8);
FROZEN(maxdev_value, u.tensor_list, 8, 16);
FROZEN(maxdev_value, u.tensor_list.data, 8, 8);
FROZEN(maxdev_value, u.tensor_list.size, 16, 8);
// 1.3
FROZEN(maxdev_value, u.bool_list, 8, 16);
FROZEN(maxdev_value, u.bool_list.data, 8, 8);
FROZEN(maxdev_value, u.bool_list.size, 16, 8);

// --- maxdev_host_api -------------------------------------------------------
static_assert(sizeof(maxdev_host_api) == 64 && alignof(maxdev_host_api) == 8,
              "maxdev_host_api (a new minor appends: update the total, keep the fields)");
FROZEN(maxdev_host_api, struct_size, 0, 8);
FROZEN(maxdev_host_api, abi_major, 8, 4);
FROZEN(maxdev_host_api, abi_minor, 12, 4);
FROZEN(maxdev_host_api, alloc_output, 16, 8);
FROZEN(maxdev_host_api, set_error, 24, 8);
FROZEN(maxdev_host_api, log, 32, 8);
// 1.1
FROZEN(maxdev_host_api, resize_output, 40, 8);
// 1.2
FROZEN(maxdev_host_api, parallel_for, 48, 8);
// 1.4
FROZEN(maxdev_host_api, num_threads, 56, 8);

// --- maxdev_call -----------------------------------------------------------
static_assert(sizeof(maxdev_call) == 56 && alignof(maxdev_call) == 8, "maxdev_call");
FROZEN(maxdev_call, struct_size, 0, 8);
FROZEN(maxdev_call, host, 8, 8);
FROZEN(maxdev_call, ctx, 16, 8);
FROZEN(maxdev_call, plugin_state, 24, 8);
FROZEN(maxdev_call, args, 32, 8);
FROZEN(maxdev_call, num_args, 40, 4);
FROZEN(maxdev_call, num_outputs, 44, 4);
FROZEN(maxdev_call, outputs, 48, 8);

// --- maxdev_kernel_def -----------------------------------------------------
static_assert(sizeof(maxdev_kernel_def) == 64 && alignof(maxdev_kernel_def) == 8,
              "maxdev_kernel_def");
FROZEN(maxdev_kernel_def, struct_size, 0, 8);
FROZEN(maxdev_kernel_def, op, 8, 8);
FROZEN(maxdev_kernel_def, schema, 16, 8);
FROZEN(maxdev_kernel_def, fn, 24, 8);
FROZEN(maxdev_kernel_def, dtypes, 32, 8);
FROZEN(maxdev_kernel_def, flags, 40, 8);
// 1.1
FROZEN(maxdev_kernel_def, meta, 48, 8);
FROZEN(maxdev_kernel_def, backward, 56, 8);

// --- maxdev_plugin_def -----------------------------------------------------
static_assert(sizeof(maxdev_plugin_def) == 64 && alignof(maxdev_plugin_def) == 8,
              "maxdev_plugin_def");
// The first three fields are frozen for every major, not just this one.
FROZEN(maxdev_plugin_def, struct_size, 0, 8);
FROZEN(maxdev_plugin_def, abi_major, 8, 4);
FROZEN(maxdev_plugin_def, abi_minor, 12, 4);
FROZEN(maxdev_plugin_def, name, 16, 8);
FROZEN(maxdev_plugin_def, version, 24, 8);
FROZEN(maxdev_plugin_def, kernels, 32, 8);
FROZEN(maxdev_plugin_def, num_kernels, 40, 8);
FROZEN(maxdev_plugin_def, init, 48, 8);
FROZEN(maxdev_plugin_def, teardown, 56, 8);

// --- maxdev_manifest_record ------------------------------------------------
static_assert(sizeof(maxdev_manifest_record) == 672 && alignof(maxdev_manifest_record) == 8,
              "maxdev_manifest_record");
FROZEN(maxdev_manifest_record, magic, 0, 4);
FROZEN(maxdev_manifest_record, record_size, 4, 4);
FROZEN(maxdev_manifest_record, kind, 8, 4);
FROZEN(maxdev_manifest_record, abi_major, 12, 2);
FROZEN(maxdev_manifest_record, abi_minor, 14, 2);
FROZEN(maxdev_manifest_record, dtypes, 16, 8);
FROZEN(maxdev_manifest_record, flags, 24, 8);
FROZEN(maxdev_manifest_record, name, 32, 128);
FROZEN(maxdev_manifest_record, text, 160, 512);

// --- function pointer types -----------------------------------------------
static_assert(std::is_same_v<maxdev_kernel_fn, maxdev_status (*)(const maxdev_call*)>,
              "maxdev_kernel_fn signature");
static_assert(std::is_same_v<maxdev_plugin_entry_fn,
                             maxdev_status (*)(const maxdev_host_api*, const maxdev_plugin_def**)>,
              "maxdev_plugin_entry_fn signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::alloc_output),
                             maxdev_status (*)(maxdev_host_context*, int32_t, maxdev_dtype,
                                               int32_t, const int64_t*, const maxdev_tensor**)>,
              "alloc_output signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::set_error),
                             maxdev_status (*)(maxdev_host_context*, const char*)>,
              "set_error signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::log),
                             void (*)(maxdev_host_context*, int32_t, const char*)>,
              "log signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::resize_output),
                             maxdev_status (*)(maxdev_host_context*, int32_t, int32_t,
                                               const int64_t*, const maxdev_tensor**)>,
              "resize_output signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::parallel_for),
                             void (*)(maxdev_host_context*, int64_t, int64_t, int64_t,
                                      void (*)(void*, int64_t, int64_t), void*)>,
              "parallel_for signature");
static_assert(std::is_same_v<decltype(maxdev_host_api::num_threads), int32_t (*)(maxdev_host_context*)>,
              "num_threads signature");
static_assert(std::is_same_v<decltype(maxdev_kernel_def::meta), maxdev_kernel_fn>,
              "meta signature");
static_assert(std::is_same_v<decltype(maxdev_plugin_def::init),
                             maxdev_status (*)(const maxdev_host_api*, maxdev_host_context*,
                                               void**)>,
              "init signature");
static_assert(std::is_same_v<decltype(maxdev_plugin_def::teardown), void (*)(void*)>,
              "teardown signature");

#endif  // __x86_64__

// The structs are plain C data the host and plugins copy and share freely.
static_assert(std::is_trivially_copyable_v<maxdev_tensor> &&
                  std::is_standard_layout_v<maxdev_tensor> &&
                  std::is_standard_layout_v<maxdev_value> &&
                  std::is_standard_layout_v<maxdev_call> &&
                  std::is_standard_layout_v<maxdev_plugin_def> &&
                  std::is_standard_layout_v<maxdev_manifest_record>,
              "ABI structs are standard-layout C structs");

namespace {

// offsetof/sizeof of one field in two structs, compared at run time so a
// mismatch names the field.
#define EXPECT_SAME_FIELD(A, a, B, b)                               \
  do {                                                              \
    EXPECT_EQ(offsetof(A, a), offsetof(B, b)) << #A "." #a " offset"; \
    EXPECT_EQ(sizeof(static_cast<A*>(nullptr)->a),                 \
              sizeof(static_cast<B*>(nullptr)->b))                  \
        << #A "." #a " size";                                       \
  } while (0)

TEST(AbiLayout, DLPackVersionIsOne) {
  EXPECT_EQ(DLPACK_MAJOR_VERSION, 1);
}

TEST(AbiLayout, TensorMatchesDLTensor) {
  EXPECT_EQ(sizeof(maxdev_tensor), sizeof(DLTensor));
  EXPECT_EQ(alignof(maxdev_tensor), alignof(DLTensor));
  EXPECT_SAME_FIELD(maxdev_tensor, data, DLTensor, data);
  EXPECT_SAME_FIELD(maxdev_tensor, device, DLTensor, device);
  EXPECT_SAME_FIELD(maxdev_tensor, ndim, DLTensor, ndim);
  EXPECT_SAME_FIELD(maxdev_tensor, dtype, DLTensor, dtype);
  EXPECT_SAME_FIELD(maxdev_tensor, shape, DLTensor, shape);
  EXPECT_SAME_FIELD(maxdev_tensor, strides, DLTensor, strides);
  EXPECT_SAME_FIELD(maxdev_tensor, byte_offset, DLTensor, byte_offset);
  // Field types, not only sizes.
  EXPECT_TRUE((std::is_same_v<decltype(maxdev_tensor::shape), decltype(DLTensor::shape)>));
  EXPECT_TRUE((std::is_same_v<decltype(maxdev_tensor::strides), decltype(DLTensor::strides)>));
  EXPECT_TRUE(
      (std::is_same_v<decltype(maxdev_tensor::byte_offset), decltype(DLTensor::byte_offset)>));
  EXPECT_TRUE((std::is_same_v<decltype(maxdev_tensor::ndim), decltype(DLTensor::ndim)>));
}

TEST(AbiLayout, DeviceMatchesDLDevice) {
  EXPECT_EQ(sizeof(maxdev_device), sizeof(DLDevice));
  EXPECT_EQ(alignof(maxdev_device), alignof(DLDevice));
  EXPECT_SAME_FIELD(maxdev_device, device_type, DLDevice, device_type);
  EXPECT_SAME_FIELD(maxdev_device, device_id, DLDevice, device_id);
  EXPECT_EQ(MAXDEV_DEVICE_CPU, static_cast<int>(kDLCPU));
  EXPECT_EQ(MAXDEV_DEVICE_MAX, static_cast<int>(kDLExtDev));
}

TEST(AbiLayout, DtypeMatchesDLDataType) {
  EXPECT_EQ(sizeof(maxdev_dtype), sizeof(DLDataType));
  EXPECT_EQ(alignof(maxdev_dtype), alignof(DLDataType));
  EXPECT_SAME_FIELD(maxdev_dtype, code, DLDataType, code);
  EXPECT_SAME_FIELD(maxdev_dtype, bits, DLDataType, bits);
  EXPECT_SAME_FIELD(maxdev_dtype, lanes, DLDataType, lanes);
  EXPECT_EQ(MAXDEV_TYPE_INT, static_cast<int>(kDLInt));
  EXPECT_EQ(MAXDEV_TYPE_UINT, static_cast<int>(kDLUInt));
  EXPECT_EQ(MAXDEV_TYPE_FLOAT, static_cast<int>(kDLFloat));
  EXPECT_EQ(MAXDEV_TYPE_BFLOAT, static_cast<int>(kDLBfloat));
  EXPECT_EQ(MAXDEV_TYPE_COMPLEX, static_cast<int>(kDLComplex));
  EXPECT_EQ(MAXDEV_TYPE_BOOL, static_cast<int>(kDLBool));
}

// A maxdev_tensor read through DLTensor sees the same values.
TEST(AbiLayout, TensorReadsAsDLTensor) {
  float buf[6] = {0, 1, 2, 3, 4, 5};
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {1, 2};
  maxdev_tensor t{};
  t.data = buf;
  t.device.device_type = MAXDEV_DEVICE_MAX;
  t.device.device_id = 0;
  t.ndim = 2;
  t.dtype.code = MAXDEV_TYPE_FLOAT;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 4;
  const auto* d = reinterpret_cast<const DLTensor*>(&t);
  EXPECT_EQ(d->data, static_cast<void*>(buf));
  EXPECT_EQ(static_cast<int>(d->device.device_type), static_cast<int>(kDLExtDev));
  EXPECT_EQ(d->device.device_id, 0);
  EXPECT_EQ(d->ndim, 2);
  EXPECT_EQ(d->dtype.code, kDLFloat);
  EXPECT_EQ(d->dtype.bits, 32);
  EXPECT_EQ(d->dtype.lanes, 1);
  EXPECT_EQ(d->shape, shape);
  EXPECT_EQ(d->strides, strides);
  EXPECT_EQ(d->byte_offset, 4u);
  EXPECT_EQ(maxdev_tensor_data(&t), static_cast<void*>(buf + 1));
}

TEST(AbiLayout, FrozenPrefixOfPluginDef) {
  // The host reads these three fields of a plugin of any major, so they stay
  // where they are in every major version.
  EXPECT_EQ(offsetof(maxdev_plugin_def, struct_size), 0u);
  EXPECT_EQ(offsetof(maxdev_plugin_def, abi_major), sizeof(size_t));
  EXPECT_EQ(offsetof(maxdev_plugin_def, abi_minor), sizeof(size_t) + sizeof(uint32_t));
}

TEST(AbiLayout, HelpersAgreeWithLayout) {
  int64_t shape[3] = {2, 3, 4};
  int64_t contiguous[3] = {12, 4, 1};
  int64_t transposed[3] = {12, 1, 3};
  maxdev_tensor t{};
  t.ndim = 3;
  t.shape = shape;
  t.strides = contiguous;
  EXPECT_EQ(maxdev_tensor_numel(&t), 24);
  EXPECT_TRUE(maxdev_tensor_is_contiguous(&t));
  t.strides = transposed;
  EXPECT_FALSE(maxdev_tensor_is_contiguous(&t));
  // Size-1 dimensions do not count.
  int64_t shape1[2] = {1, 5};
  int64_t strides1[2] = {99, 1};
  t.ndim = 2;
  t.shape = shape1;
  t.strides = strides1;
  EXPECT_TRUE(maxdev_tensor_is_contiguous(&t));
  maxdev_tensor scalar{};
  EXPECT_EQ(maxdev_tensor_numel(&scalar), 1);
  EXPECT_TRUE(maxdev_tensor_is_contiguous(&scalar));
}

}  // namespace
