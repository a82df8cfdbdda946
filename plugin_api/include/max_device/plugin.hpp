// max_device plugin SDK for C++17 — header-only, over the C ABI in plugin.h.
//
// Nothing from this header crosses the plugin boundary: a kernel written as
//
//   void my_kernel(maxdev::Call& call) { ... }
//
// is turned into a C `maxdev_kernel_fn` by MAXDEV_SDK_KERNEL(my_kernel), which
// catches every exception at the edge and converts it to a status:
//
//   throw maxdev::Declined{};        -> MAXDEV_DECLINED (PyTorch's kernel runs)
//   throw maxdev::Error("message");  -> MAXDEV_ERROR, message reaches Python
//   any other std::exception         -> MAXDEV_ERROR with what()
//   anything else                    -> MAXDEV_ERROR "unknown C++ exception"
//
// The adapted kernel goes into the ordinary MAXDEV_DEFINE_PLUGIN list
// (line continuations left out here):
//
//   #define MY_KERNELS(K)
//     K("aten::silu.out", "", MAXDEV_SDK_KERNEL(silu_out),
//       MAXDEV_DTYPE_FLOAT32, MAXDEV_KERNEL_CONTIGUOUS_ONLY)
//   MAXDEV_DEFINE_PLUGIN("myplugin", "1.0.0", MY_KERNELS, nullptr, nullptr)
//
// No torch header, no static locals, no thread_local: see README.md for the
// build rules every plugin obeys.
#ifndef MAX_DEVICE_PLUGIN_HPP_
#define MAX_DEVICE_PLUGIN_HPP_

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "max_device/plugin.hpp needs C++17; C plugins include max_device/plugin.h"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "max_device/plugin.h"

namespace maxdev {

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Thrown by a kernel (or by the accessors below) to fail the call; the
// message reaches Python as the error text.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by a kernel to decline the call: the provider below (another plugin
// or PyTorch's CPU kernel) runs instead. Not an error.
struct Declined {};

// ---------------------------------------------------------------------------
// Dtypes
// ---------------------------------------------------------------------------

inline constexpr maxdev_dtype kBool{MAXDEV_TYPE_BOOL, 8, 1};
inline constexpr maxdev_dtype kUInt8{MAXDEV_TYPE_UINT, 8, 1};
inline constexpr maxdev_dtype kInt8{MAXDEV_TYPE_INT, 8, 1};
inline constexpr maxdev_dtype kInt16{MAXDEV_TYPE_INT, 16, 1};
inline constexpr maxdev_dtype kInt32{MAXDEV_TYPE_INT, 32, 1};
inline constexpr maxdev_dtype kInt64{MAXDEV_TYPE_INT, 64, 1};
inline constexpr maxdev_dtype kFloat16{MAXDEV_TYPE_FLOAT, 16, 1};
inline constexpr maxdev_dtype kBFloat16{MAXDEV_TYPE_BFLOAT, 16, 1};
inline constexpr maxdev_dtype kFloat32{MAXDEV_TYPE_FLOAT, 32, 1};
inline constexpr maxdev_dtype kFloat64{MAXDEV_TYPE_FLOAT, 64, 1};
inline constexpr maxdev_dtype kComplex64{MAXDEV_TYPE_COMPLEX, 64, 1};
inline constexpr maxdev_dtype kComplex128{MAXDEV_TYPE_COMPLEX, 128, 1};

constexpr bool same_dtype(maxdev_dtype a, maxdev_dtype b) noexcept {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
// Found by ordinary lookup inside namespace maxdev (or after
// `using maxdev::operator==;`); maxdev_dtype itself is a C type.
constexpr bool operator==(maxdev_dtype a, maxdev_dtype b) noexcept {
  return same_dtype(a, b);
}
constexpr bool operator!=(maxdev_dtype a, maxdev_dtype b) noexcept {
  return !same_dtype(a, b);
}

// "float32", "int64", ... (PyTorch's names, maxdev_dtype_name);
// "dtype(code=C,bits=B,lanes=L)" for anything else.
inline std::string dtype_name(maxdev_dtype d) {
  if (const char* name = maxdev_dtype_name(d)) return name;
  return "dtype(code=" + std::to_string(d.code) + ",bits=" + std::to_string(d.bits) + ",lanes=" +
         std::to_string(d.lanes) + ")";
}

// The dtype of a C++ element type, for Tensor::data<T>().
template <typename T>
struct dtype_of;  // no definition: data<T>() of an unlisted T does not compile
template <> struct dtype_of<bool> { static constexpr maxdev_dtype value = kBool; };
template <> struct dtype_of<uint8_t> { static constexpr maxdev_dtype value = kUInt8; };
template <> struct dtype_of<int8_t> { static constexpr maxdev_dtype value = kInt8; };
template <> struct dtype_of<int16_t> { static constexpr maxdev_dtype value = kInt16; };
template <> struct dtype_of<int32_t> { static constexpr maxdev_dtype value = kInt32; };
template <> struct dtype_of<int64_t> { static constexpr maxdev_dtype value = kInt64; };
template <> struct dtype_of<float> { static constexpr maxdev_dtype value = kFloat32; };
template <> struct dtype_of<double> { static constexpr maxdev_dtype value = kFloat64; };

// Name of a maxdev_value_kind as it reads in a schema.
inline const char* kind_name(int32_t kind) noexcept {
  switch (kind) {
    case MAXDEV_VALUE_NONE: return "None";
    case MAXDEV_VALUE_TENSOR: return "Tensor";
    case MAXDEV_VALUE_INT: return "int";
    case MAXDEV_VALUE_FLOAT: return "float";
    case MAXDEV_VALUE_BOOL: return "bool";
    case MAXDEV_VALUE_INT_LIST: return "int[]";
    case MAXDEV_VALUE_TENSOR_LIST: return "Tensor[]";
    case MAXDEV_VALUE_STRING: return "str";
    case MAXDEV_VALUE_DTYPE: return "ScalarType";
    case MAXDEV_VALUE_FLOAT_LIST: return "float[]";
    case MAXDEV_VALUE_BOOL_LIST: return "bool[]";
    default: return "unknown kind";
  }
}

// ---------------------------------------------------------------------------
// ArrayView: a read-only span over memory the host owns for the call.
// ---------------------------------------------------------------------------

template <typename T>
class ArrayView {
 public:
  constexpr ArrayView() noexcept = default;
  constexpr ArrayView(const T* data, size_t size) noexcept
      : data_(data), size_(size) {}

  constexpr const T* data() const noexcept { return data_; }
  constexpr size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr const T* begin() const noexcept { return data_; }
  constexpr const T* end() const noexcept { return data_ + size_; }
  constexpr const T& operator[](size_t i) const noexcept { return data_[i]; }
  // Bounds-checked access; throws maxdev::Error.
  const T& at(size_t i) const {
    if (i >= size_)
      throw Error("index " + std::to_string(i) + " out of range for a list of " +
                  std::to_string(size_));
    return data_[i];
  }
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// Tensor: a borrowed view of a maxdev_tensor, valid for the call.
// ---------------------------------------------------------------------------

class Tensor {
 public:
  explicit Tensor(const maxdev_tensor* t) : t_(t) {
    if (t_ == nullptr) throw Error("null tensor");
  }

  const maxdev_tensor* raw() const noexcept { return t_; }

  int64_t ndim() const noexcept { return t_->ndim; }
  ArrayView<int64_t> shape() const noexcept {
    return ArrayView<int64_t>(t_->shape, static_cast<size_t>(t_->ndim));
  }
  ArrayView<int64_t> strides() const noexcept {
    return ArrayView<int64_t>(t_->strides, static_cast<size_t>(t_->ndim));
  }
  // Size / stride (in elements) of dimension d; negative d counts from the
  // end like PyTorch. Throws maxdev::Error when d is out of range.
  int64_t size(int64_t d) const { return t_->shape[wrap_dim(d)]; }
  int64_t stride(int64_t d) const { return t_->strides[wrap_dim(d)]; }
  int64_t numel() const noexcept { return maxdev_tensor_numel(t_); }

  maxdev_dtype dtype() const noexcept { return t_->dtype; }
  bool has_dtype(maxdev_dtype d) const noexcept { return same_dtype(t_->dtype, d); }
  bool is_contiguous() const noexcept { return maxdev_tensor_is_contiguous(t_) != 0; }
  bool is_cpu() const noexcept { return t_->device.device_type == MAXDEV_DEVICE_CPU; }

  // First element (data + byte_offset), untyped.
  void* data_ptr() const noexcept { return maxdev_tensor_data(t_); }

  // First element, typed. Throws maxdev::Error when the tensor's dtype is
  // not T's.
  template <typename T>
  T* data() const {
    using U = std::remove_cv_t<T>;
    constexpr maxdev_dtype want = dtype_of<U>::value;
    if (!same_dtype(t_->dtype, want))
      throw Error("tensor has dtype " + dtype_name(t_->dtype) + ", data<" +
                  dtype_name(want) + ">() needs " + dtype_name(want));
    return static_cast<T*>(data_ptr());
  }

 private:
  size_t wrap_dim(int64_t d) const {
    const int64_t n = t_->ndim;
    const int64_t w = d < 0 ? d + n : d;
    if (w < 0 || w >= n)
      throw Error("dimension " + std::to_string(d) + " out of range for a " +
                  std::to_string(n) + "-dim tensor");
    return static_cast<size_t>(w);
  }

  const maxdev_tensor* t_;
};

// ---------------------------------------------------------------------------
// Call: the boxed arguments and the host's services for one kernel call.
// Accessors check the argument's kind and throw maxdev::Error naming the
// index and the expected and actual kinds.
// ---------------------------------------------------------------------------

class Call {
 public:
  explicit Call(const maxdev_call* c) : c_(c) {
    if (c_ == nullptr || c_->host == nullptr) throw Error("null call");
  }

  const maxdev_call* raw() const noexcept { return c_; }
  const maxdev_host_api& host() const noexcept { return *c_->host; }

  int num_args() const noexcept { return c_->num_args; }
  int num_outputs() const noexcept { return c_->num_outputs; }

  // The raw value of argument i (bounds-checked).
  const maxdev_value& arg(int i) const {
    if (i < 0 || i >= c_->num_args)
      throw Error("argument " + std::to_string(i) + " out of range: the call has " +
                  std::to_string(c_->num_args) + " arguments");
    return c_->args[i];
  }
  int32_t kind(int i) const { return arg(i).kind; }
  bool is_none(int i) const { return kind(i) == MAXDEV_VALUE_NONE; }
  // Whether argument i had the schema type Scalar.
  bool is_scalar(int i) const { return (arg(i).flags & MAXDEV_VALUE_FLAG_SCALAR) != 0; }

  Tensor tensor(int i) const { return Tensor(expect(i, MAXDEV_VALUE_TENSOR).u.tensor); }
  std::optional<Tensor> optional_tensor(int i) const {
    if (is_none(i)) return std::nullopt;
    return tensor(i);
  }
  std::vector<Tensor> tensor_list(int i) const {
    const maxdev_value& v = expect(i, MAXDEV_VALUE_TENSOR_LIST);
    std::vector<Tensor> out;
    out.reserve(static_cast<size_t>(v.u.tensor_list.size));
    for (int64_t k = 0; k < v.u.tensor_list.size; ++k)
      out.emplace_back(&v.u.tensor_list.data[k]);
    return out;
  }

  int64_t integer(int i) const { return expect(i, MAXDEV_VALUE_INT).u.i; }
  std::optional<int64_t> optional_integer(int i) const {
    if (is_none(i)) return std::nullopt;
    return integer(i);
  }
  // A float, int or bool argument (e.g. a Scalar) as a double.
  double real(int i) const {
    const maxdev_value& v = arg(i);
    switch (v.kind) {
      case MAXDEV_VALUE_FLOAT: return v.u.f;
      case MAXDEV_VALUE_INT: return static_cast<double>(v.u.i);
      case MAXDEV_VALUE_BOOL: return v.u.b != 0 ? 1.0 : 0.0;
      default: throw wrong_kind(i, "float, int or bool", v.kind);
    }
  }
  std::optional<double> optional_real(int i) const {
    if (is_none(i)) return std::nullopt;
    return real(i);
  }
  bool boolean(int i) const { return expect(i, MAXDEV_VALUE_BOOL).u.b != 0; }

  ArrayView<int64_t> int_list(int i) const {
    const maxdev_value& v = expect(i, MAXDEV_VALUE_INT_LIST);
    return ArrayView<int64_t>(v.u.int_list.data, static_cast<size_t>(v.u.int_list.size));
  }
  // `int[]?` (e.g. sum's dim): nullopt for None.
  std::optional<ArrayView<int64_t>> optional_int_list(int i) const {
    if (is_none(i)) return std::nullopt;
    return int_list(i);
  }
  ArrayView<double> float_list(int i) const {
    const maxdev_value& v = expect(i, MAXDEV_VALUE_FLOAT_LIST);
    return ArrayView<double>(v.u.float_list.data, static_cast<size_t>(v.u.float_list.size));
  }
  // `bool[]`, `bool[N]` (ABI 1.3): 0 or 1 per element.
  ArrayView<uint8_t> bool_list(int i) const {
    const maxdev_value& v = expect(i, MAXDEV_VALUE_BOOL_LIST);
    return ArrayView<uint8_t>(v.u.bool_list.data, static_cast<size_t>(v.u.bool_list.size));
  }

  std::string_view string(int i) const {
    const char* s = expect(i, MAXDEV_VALUE_STRING).u.string;
    return s != nullptr ? std::string_view(s) : std::string_view();
  }
  std::optional<std::string_view> optional_string(int i) const {
    if (is_none(i)) return std::nullopt;
    return string(i);
  }

  maxdev_dtype dtype(int i) const { return expect(i, MAXDEV_VALUE_DTYPE).u.dtype; }
  std::optional<maxdev_dtype> optional_dtype(int i) const {
    if (is_none(i)) return std::nullopt;
    return dtype(i);
  }

  // Output i when the host set it before the call (in-place and out= ops),
  // or after alloc_output(i, ...).
  Tensor output(int i) const {
    check_output_index(i);
    const maxdev_tensor* t = c_->outputs != nullptr ? c_->outputs[i] : nullptr;
    if (t == nullptr)
      throw Error("output " + std::to_string(i) +
                  " is not set: a functional op allocates it with alloc_output");
    return Tensor(t);
  }

  // Allocate output i (contiguous, on the device) for a functional op.
  Tensor alloc_output(int i, maxdev_dtype dtype, const int64_t* shape, size_t ndim) const {
    check_output_index(i);
    if (c_->host->alloc_output == nullptr) throw Error("host has no alloc_output");
    const maxdev_tensor* t = nullptr;
    const maxdev_status st = c_->host->alloc_output(c_->ctx, i, dtype,
                                                    static_cast<int32_t>(ndim), shape, &t);
    if (st != MAXDEV_OK || t == nullptr)
      throw Error("alloc_output(" + std::to_string(i) + ") failed");
    return Tensor(t);
  }
  Tensor alloc_output(int i, maxdev_dtype dtype, std::initializer_list<int64_t> shape) const {
    return alloc_output(i, dtype, shape.begin(), shape.size());
  }
  Tensor alloc_output(int i, maxdev_dtype dtype, const std::vector<int64_t>& shape) const {
    return alloc_output(i, dtype, shape.data(), shape.size());
  }
  Tensor alloc_output(int i, maxdev_dtype dtype, ArrayView<int64_t> shape) const {
    return alloc_output(i, dtype, shape.data(), shape.size());
  }

  // Resize output i, an out= argument, to `shape` the way PyTorch's out=
  // kernels do (an explicit out= reaches the kernel as the user passed it,
  // e.g. empty): call it with the shape the kernel will write. Returns the
  // resized tensor (output(i) returns it too). Needs a host of ABI >= 1.1.
  Tensor resize_output(int i, const int64_t* shape, size_t ndim) const {
    check_output_index(i);
    if (!MAXDEV_HOST_HAS(c_->host, resize_output))
      throw Error("this max_device host (ABI < 1.1) has no resize_output");
    const maxdev_tensor* t = nullptr;
    if (c_->host->resize_output(c_->ctx, i, static_cast<int32_t>(ndim), shape, &t) != MAXDEV_OK ||
        t == nullptr)
      throw Error("resize_output(" + std::to_string(i) + ") failed");
    return Tensor(t);
  }
  Tensor resize_output(int i, const std::vector<int64_t>& shape) const {
    return resize_output(i, shape.data(), shape.size());
  }
  Tensor resize_output(int i, ArrayView<int64_t> shape) const {
    return resize_output(i, shape.data(), shape.size());
  }

  // Run fn(b, e) over subranges of [begin, end) on the host's thread pool
  // (ABI 1.2; serially on an older host), none shorter than grain. The first
  // exception fn throws is rethrown here once every subrange has finished.
  template <typename F>
  void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) const {
    if (!MAXDEV_HOST_HAS(c_->host, parallel_for)) {
      if (begin < end) fn(begin, end);
      return;
    }
    struct Job {
      F* fn;
      std::atomic<bool> failed;
      std::exception_ptr error;
    } job{&fn, {false}, nullptr};
    c_->host->parallel_for(c_->ctx, begin, end, grain, [](void* user, int64_t b, int64_t e) {
      Job& j = *static_cast<Job*>(user);
      try {
        (*j.fn)(b, e);
      } catch (...) {
        if (!j.failed.exchange(true)) j.error = std::current_exception();
      }
    }, &job);
    if (job.error) std::rethrow_exception(job.error);
  }

  // Threads a parallel_for from here may use (ABI 1.4; 1 on an older host,
  // whose parallel_for may still use more).
  int num_threads() const {
    return MAXDEV_HOST_HAS(c_->host, num_threads) ? std::max(1, c_->host->num_threads(c_->ctx)) : 1;
  }

  // Log through the host's logger (MAXDEV_LOG_*).
  void log(int32_t level, const std::string& message) const {
    if (c_->host->log != nullptr) c_->host->log(c_->ctx, level, message.c_str());
  }

  // What the plugin's init stored. Throws maxdev::Error when it is NULL.
  template <typename T>
  T& state() const {
    if (c_->plugin_state == nullptr) throw Error("plugin has no state (init stored NULL)");
    return *static_cast<T*>(c_->plugin_state);
  }

 private:
  static Error wrong_kind(int i, const char* expected, int32_t actual) {
    return Error("argument " + std::to_string(i) + ": expected " + expected + ", got " +
                 kind_name(actual));
  }
  const maxdev_value& expect(int i, int32_t want) const {
    const maxdev_value& v = arg(i);
    if (v.kind != want) throw wrong_kind(i, kind_name(want), v.kind);
    return v;
  }
  void check_output_index(int i) const {
    if (i < 0 || i >= c_->num_outputs)
      throw Error("output " + std::to_string(i) + " out of range: the op returns " +
                  std::to_string(c_->num_outputs) + " tensors");
  }

  const maxdev_call* c_;
};


// ---------------------------------------------------------------------------
// 16-bit floating types, for data<T>() and the dtype dispatch below: storage
// only, converted to and from float (round to nearest even) by the C SDK's
// maxdev_float_to_float16 & co.
// ---------------------------------------------------------------------------

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(maxdev_float_to_float16(f)) {}  // NOLINT: implicit like a float
  operator float() const { return maxdev_float16_to_float(bits); }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(maxdev_float_to_bfloat16(f)) {}  // NOLINT: implicit like a float
  operator float() const { return maxdev_bfloat16_to_float(bits); }
};

template <> struct dtype_of<Half> { static constexpr maxdev_dtype value = kFloat16; };
template <> struct dtype_of<BFloat16> { static constexpr maxdev_dtype value = kBFloat16; };

// ---------------------------------------------------------------------------
// Dtype dispatch: call f(type_tag<T>{}) with the C++ type of `dtype`, e.g.
//
//   maxdev::dispatch_floating(x.dtype(), [&](auto tag) {
//     using T = typename decltype(tag)::type;
//     ... x.data<T>() ...
//   });
//
// A dtype outside the set throws maxdev::Declined: the call passes down
// the stack (to PyTorch's kernel), as if the kernel's mask excluded it.
// ---------------------------------------------------------------------------

template <typename T>
struct type_tag {
  using type = T;
};

// float32, float64, bfloat16, float16.
template <typename F>
decltype(auto) dispatch_floating(maxdev_dtype dtype, F&& f) {
  switch (maxdev_dtype_bit(dtype)) {
    case MAXDEV_DTYPE_FLOAT32: return f(type_tag<float>{});
    case MAXDEV_DTYPE_FLOAT64: return f(type_tag<double>{});
    case MAXDEV_DTYPE_BFLOAT16: return f(type_tag<BFloat16>{});
    case MAXDEV_DTYPE_FLOAT16: return f(type_tag<Half>{});
    default: throw Declined{};
  }
}

// uint8, int8, int16, int32, int64.
template <typename F>
decltype(auto) dispatch_integral(maxdev_dtype dtype, F&& f) {
  switch (maxdev_dtype_bit(dtype)) {
    case MAXDEV_DTYPE_INT64: return f(type_tag<int64_t>{});
    case MAXDEV_DTYPE_INT32: return f(type_tag<int32_t>{});
    case MAXDEV_DTYPE_INT16: return f(type_tag<int16_t>{});
    case MAXDEV_DTYPE_INT8: return f(type_tag<int8_t>{});
    case MAXDEV_DTYPE_UINT8: return f(type_tag<uint8_t>{});
    default: throw Declined{};
  }
}

// Floating and integral types (not bool, not complex).
template <typename F>
decltype(auto) dispatch_real(maxdev_dtype dtype, F&& f) {
  if (dtype.code == MAXDEV_TYPE_INT || dtype.code == MAXDEV_TYPE_UINT)
    return dispatch_integral(dtype, std::forward<F>(f));
  return dispatch_floating(dtype, std::forward<F>(f));
}

namespace detail {
// Turns a C SDK helper's outcome into the C++ SDK's: MAXDEV_ERROR throws
// maxdev::Error with its message, MAXDEV_DECLINED throws maxdev::Declined.
inline void check_sdk_status(maxdev_status st, const char* error) {
  if (st == MAXDEV_ERROR) throw Error(error);
  if (st == MAXDEV_DECLINED) throw Declined{};
}
}  // namespace detail

// ---------------------------------------------------------------------------
// Scalars: the value of a one-element tensor (a 0-dim CPU scalar such as the
// `other` of torch.mul(x, 2.5), or a device tensor) of any real dtype or bool.
// ---------------------------------------------------------------------------

// Read by maxdev_scalar_to_int64 for an integral T, maxdev_scalar_to_double
// otherwise. More than one element throws maxdev::Error; a complex dtype
// throws maxdev::Declined.
template <typename T>
T scalar_value(const Tensor& t) {
  char error[MAXDEV_ERROR_SIZE] = "";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    int64_t v = 0;
    detail::check_sdk_status(maxdev_scalar_to_int64(t.raw(), &v, error), error);
    return static_cast<T>(v);
  } else {
    double v = 0.0;
    detail::check_sdk_status(maxdev_scalar_to_double(t.raw(), &v, error), error);
    return static_cast<T>(static_cast<std::conditional_t<std::is_class_v<T>, float, double>>(v));
  }
}

// ---------------------------------------------------------------------------
// Aliasing between an output and an input, as PyTorch judges it for out=
// and in-place ops: the same elements (in-place is fine), disjoint memory,
// or a partial overlap (no elementwise kernel can write that correctly).
// ---------------------------------------------------------------------------

enum class Overlap { none = MAXDEV_OVERLAP_NONE, same = MAXDEV_OVERLAP_SAME, partial = MAXDEV_OVERLAP_PARTIAL };

inline Overlap overlap(const Tensor& a, const Tensor& b) {
  return static_cast<Overlap>(maxdev_tensor_overlap(a.raw(), b.raw()));
}

// Throws maxdev::Error (PyTorch's message) when `out` partially overlaps
// any of `inputs`.
inline void check_no_partial_overlap(const Tensor& out, std::initializer_list<Tensor> inputs) {
  for (const Tensor& in : inputs)
    if (overlap(out, in) == Overlap::partial)
      throw Error("unsupported operation: some elements of the input tensor and the written-to tensor "
                  "refer to a single memory location. Please clone() the tensor before performing the "
                  "operation.");
}

// ---------------------------------------------------------------------------
// Broadcasting iteration over N strided tensors (a small TensorIterator).
// ---------------------------------------------------------------------------

// The broadcast shape of `shapes` (PyTorch's rules; maxdev_broadcast_shape);
// throws maxdev::Error when they do not broadcast.
inline std::vector<int64_t> broadcast_shape(std::initializer_list<ArrayView<int64_t>> shapes) {
  // Shape-only views: maxdev_broadcast_shape reads nothing else.
  std::vector<maxdev_tensor> views(shapes.size());
  std::vector<const maxdev_tensor*> operands(shapes.size());
  size_t capacity = 0, i = 0;
  for (const auto& s : shapes) {
    views[i].ndim = static_cast<int32_t>(s.size());
    views[i].shape = const_cast<int64_t*>(s.data());
    operands[i] = &views[i];
    capacity = std::max(capacity, s.size());
    ++i;
  }
  std::vector<int64_t> out(capacity);
  int32_t ndim = 0;
  char error[MAXDEV_ERROR_SIZE] = "";
  detail::check_sdk_status(maxdev_broadcast_shape(static_cast<int32_t>(operands.size()), operands.data(),
                                                  static_cast<int32_t>(capacity), out.data(), &ndim, error),
                           error);
  out.resize(static_cast<size_t>(ndim));
  return out;
}

// Visits every element of `shape` with N operands broadcast to it (the C
// SDK's maxdev_iter): calls body(ptrs, n, steps) for runs of n elements,
// where ptrs[k] points at operand k's first element of the run and steps[k]
// is its byte stride within the run (0 for a broadcast dimension).
// Dimensions that are contiguous for every operand are merged first, so a
// contiguous problem is one run. `max_run` > 0 bounds the runs' length
// (chunks). Operand k must broadcast to `shape` (else maxdev::Error); more
// than MAXDEV_ITER_MAX_DIMS dimensions left after merging throw
// maxdev::Declined.
template <size_t N, typename Body>
void for_each_run(ArrayView<int64_t> shape, const std::array<Tensor, N>& operands, Body&& body,
                  int64_t max_run = 0) {
  static_assert(N >= 1 && N <= MAXDEV_ITER_MAX_OPERANDS, "for_each_run takes 1 to MAXDEV_ITER_MAX_OPERANDS operands");
  std::array<const maxdev_tensor*, N> raw;
  for (size_t k = 0; k < N; ++k) raw[k] = operands[k].raw();
  maxdev_iter it;
  char error[MAXDEV_ERROR_SIZE] = "";
  detail::check_sdk_status(maxdev_iter_init(&it, static_cast<int32_t>(shape.size()), shape.data(),
                                            static_cast<int32_t>(N), raw.data(), error),
                           error);
  it.max_span = max_run;
  maxdev_span span;
  std::array<char*, N> ptrs;
  std::array<int64_t, N> steps;
  while (maxdev_iter_next(&it, &span)) {
    std::copy(span.ptr, span.ptr + N, ptrs.begin());
    std::copy(span.step, span.step + N, steps.begin());
    body(ptrs, span.n, steps);
  }
}

template <typename T, typename F, size_t N, size_t... I>
void elementwise_run_contiguous(T* out, int64_t n, F& f, const std::array<char*, N>& p, std::index_sequence<I...>) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(f(reinterpret_cast<const T*>(p[I + 1])[j]...));
}
template <typename T, typename F, size_t N, size_t... I>
void elementwise_run_strided(int64_t n, F& f, const std::array<char*, N>& p, const std::array<int64_t, N>& step,
                             std::index_sequence<I...>) {
  for (int64_t j = 0; j < n; ++j)
    *reinterpret_cast<T*>(p[0] + j * step[0]) =
        static_cast<T>(f(*reinterpret_cast<const T*>(p[I + 1] + j * step[I + 1])...));
}

// out[i] = f(in0[i], in1[i], ...) over out's shape, inputs broadcast to it,
// every operand of element type T (see dispatch_floating). Any strides,
// including negative and 0; a contiguous run is a plain loop. Reads all
// inputs of an element before writing it, so out may be an input (in-place)
// but must not partially overlap one (check_no_partial_overlap).
template <typename T, typename F, typename... In>
void elementwise(const Tensor& out, F&& f, const In&... in) {
  constexpr size_t N = sizeof...(In) + 1;
  const std::array<Tensor, N> operands{out, in...};
  for (const Tensor& t : operands)
    if (!same_dtype(t.dtype(), dtype_of<T>::value))
      throw Error("elementwise<" + dtype_name(dtype_of<T>::value) + ">: operand has dtype " + dtype_name(t.dtype()));
  for_each_run<N>(out.shape(), operands, [&](const std::array<char*, N>& p, int64_t n, const std::array<int64_t, N>& step) {
    bool unit = true;
    for (size_t k = 0; k < N; ++k) unit = unit && step[k] == static_cast<int64_t>(sizeof(T));
    if (unit) {  // contiguous fast path
      T* o = reinterpret_cast<T*>(p[0]);
      elementwise_run_contiguous<T>(o, n, f, p, std::make_index_sequence<N - 1>{});
    } else {
      elementwise_run_strided<T>(n, f, p, step, std::make_index_sequence<N - 1>{});
    }
  });
}

// ---------------------------------------------------------------------------
// The boundary: from `void fn(maxdev::Call&)` to a C maxdev_kernel_fn.
// ---------------------------------------------------------------------------

namespace detail {

inline maxdev_status report_error(const maxdev_call* c, const char* message) noexcept {
  if (c != nullptr && c->host != nullptr && c->host->set_error != nullptr)
    return c->host->set_error(c->ctx, message);
  return MAXDEV_ERROR;
}

template <void (*Fn)(Call&)>
maxdev_status kernel_adapter(const maxdev_call* raw) noexcept {
  try {
    Call call(raw);
    Fn(call);
    return MAXDEV_OK;
  } catch (const Declined&) {
    return MAXDEV_DECLINED;
  } catch (const std::exception& e) {
    return report_error(raw, e.what());
  } catch (...) {
    return report_error(raw, "unknown C++ exception");
  }
}

}  // namespace detail
}  // namespace maxdev

// A maxdev_kernel_fn for `void fn(maxdev::Call&)`; use it as the kernel in a
// MAXDEV_DEFINE_PLUGIN list.
#define MAXDEV_SDK_KERNEL(fn) (&::maxdev::detail::kernel_adapter<&fn>)

#endif  // MAX_DEVICE_PLUGIN_HPP_
