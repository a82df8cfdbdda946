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

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
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

// "float32", "int64", ... (PyTorch's names); "dtype(code=C,bits=B,lanes=L)"
// for anything else.
inline std::string dtype_name(maxdev_dtype d) {
  if (d.lanes == 1) {
    switch (d.code) {
      case MAXDEV_TYPE_BOOL:
        if (d.bits == 8) return "bool";
        break;
      case MAXDEV_TYPE_UINT:
        return "uint" + std::to_string(d.bits);
      case MAXDEV_TYPE_INT:
        return "int" + std::to_string(d.bits);
      case MAXDEV_TYPE_FLOAT:
        return "float" + std::to_string(d.bits);
      case MAXDEV_TYPE_BFLOAT:
        return "bfloat" + std::to_string(d.bits);
      case MAXDEV_TYPE_COMPLEX:
        return "complex" + std::to_string(d.bits);
      default:
        break;
    }
  }
  return "dtype(code=" + std::to_string(d.code) + ",bits=" +
         std::to_string(d.bits) + ",lanes=" + std::to_string(d.lanes) + ")";
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
