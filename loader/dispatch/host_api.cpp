#include "dispatch/host_api.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/native/Resize.h>

#include <array>

#include "common/log.h"
#include "dispatch/call_args.h"
#include "device/allocator.h"

namespace maxdev::dispatch {
namespace {

struct DtypeEntry {
  c10::ScalarType type;
  maxdev_dtype abi;
  uint64_t mask;
};

constexpr DtypeEntry kDtypes[] = {
    {c10::ScalarType::Bool, {MAXDEV_TYPE_BOOL, 8, 1}, MAXDEV_DTYPE_BOOL},
    {c10::ScalarType::Byte, {MAXDEV_TYPE_UINT, 8, 1}, MAXDEV_DTYPE_UINT8},
    {c10::ScalarType::Char, {MAXDEV_TYPE_INT, 8, 1}, MAXDEV_DTYPE_INT8},
    {c10::ScalarType::Short, {MAXDEV_TYPE_INT, 16, 1}, MAXDEV_DTYPE_INT16},
    {c10::ScalarType::Int, {MAXDEV_TYPE_INT, 32, 1}, MAXDEV_DTYPE_INT32},
    {c10::ScalarType::Long, {MAXDEV_TYPE_INT, 64, 1}, MAXDEV_DTYPE_INT64},
    {c10::ScalarType::Half, {MAXDEV_TYPE_FLOAT, 16, 1}, MAXDEV_DTYPE_FLOAT16},
    {c10::ScalarType::BFloat16, {MAXDEV_TYPE_BFLOAT, 16, 1}, MAXDEV_DTYPE_BFLOAT16},
    {c10::ScalarType::Float, {MAXDEV_TYPE_FLOAT, 32, 1}, MAXDEV_DTYPE_FLOAT32},
    {c10::ScalarType::Double, {MAXDEV_TYPE_FLOAT, 64, 1}, MAXDEV_DTYPE_FLOAT64},
    {c10::ScalarType::ComplexFloat, {MAXDEV_TYPE_COMPLEX, 64, 1}, MAXDEV_DTYPE_COMPLEX64},
    {c10::ScalarType::ComplexDouble, {MAXDEV_TYPE_COMPLEX, 128, 1}, MAXDEV_DTYPE_COMPLEX128},
};

// Points output `index` of the call at `t`'s (new) view.
maxdev_status publish_output(maxdev_host_context& ctx, int32_t index, const at::Tensor& t, const maxdev_tensor** out) {
  maxdev_host_context::Output& output = ctx.outputs[index];
  output.view = tensor_view(t, true);
  ctx.output_ptrs[index] = &output.view;
  *out = &output.view;
  return MAXDEV_OK;
}

maxdev_status alloc_output(maxdev_host_context* ctx, int32_t index, maxdev_dtype dtype, int32_t ndim,
                           const int64_t* shape, const maxdev_tensor** out) {
  if (ctx == nullptr || out == nullptr) return MAXDEV_ERROR;
  auto fail = [&](const std::string& why) {
    ctx->error = "alloc_output: " + why;
    ctx->host_failure = true;
    return MAXDEV_ERROR;
  };
  if (ctx->sig == nullptr) return fail("called outside a kernel call");
  if (index < 0 || index >= static_cast<int32_t>(ctx->outputs.size())) {
    return fail("output index " + std::to_string(index) + " out of range (the op returns " +
                std::to_string(ctx->outputs.size()) + ")");
  }
  if (ctx->outputs[index].alias != nullptr) {
    return fail("output " + std::to_string(index) + " is an argument the kernel writes into; use call->outputs[" +
                std::to_string(index) + "]");
  }
  if (ctx->outputs[index].allocated.defined()) return fail("output " + std::to_string(index) + " allocated twice");
  const auto type = from_abi_dtype(dtype);
  if (!type) return fail("unsupported dtype code " + std::to_string(dtype.code) + " bits " + std::to_string(dtype.bits));
  if (ndim < 0 || (ndim > 0 && shape == nullptr)) return fail("invalid shape");
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] < 0) return fail("negative size in dimension " + std::to_string(d));
  }
  try {
    const c10::IntArrayRef sizes(shape, static_cast<size_t>(ndim));
    ctx->outputs[index].allocated = ctx->meta ? at::Tensor(at::detail::empty_meta(sizes, *type, std::nullopt))
                                    : at::Tensor(at::detail::empty_generic(
                                          sizes, &device::allocator(),
                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), *type, std::nullopt));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return publish_output(*ctx, index, ctx->outputs[index].allocated, out);
}

maxdev_status resize_output(maxdev_host_context* ctx, int32_t index, int32_t ndim, const int64_t* shape,
                            const maxdev_tensor** out) {
  if (ctx == nullptr || out == nullptr) return MAXDEV_ERROR;
  auto fail = [&](const std::string& why) {
    ctx->error = "resize_output: " + why;
    ctx->host_failure = true;
    return MAXDEV_ERROR;
  };
  if (ctx->sig == nullptr) return fail("called outside a kernel call");
  if (index < 0 || index >= static_cast<int32_t>(ctx->outputs.size())) {
    return fail("output index " + std::to_string(index) + " out of range (the op returns " +
                std::to_string(ctx->outputs.size()) + ")");
  }
  if (ctx->outputs[index].alias == nullptr) {
    return fail("output " + std::to_string(index) + " is not an argument (out=) tensor; allocate it with alloc_output");
  }
  if (ndim < 0 || (ndim > 0 && shape == nullptr)) return fail("invalid shape");
  const at::Tensor& target = *ctx->outputs[index].alias;
  const c10::IntArrayRef sizes(shape, static_cast<size_t>(ndim));
  try {
    if (target.sizes() != sizes && ctx->args != nullptr) {
      // PyTorch's TensorIterator never resizes an output that is also an
      // input (mul.out(x, x, y), the in-place forms). The out= argument
      // counts once; another argument of the same tensor (the same C++
      // object too, in an unboxed call) is an input.
      int uses = 0;
      for (const at::Tensor* arg : ctx->args->tensors()) uses += arg->is_same(target) ? 1 : 0;
      TORCH_CHECK(uses <= 1, "output with shape ", target.sizes(), " doesn't match the broadcast shape ", sizes);
    }
    // PyTorch's rule for out=: resize an empty tensor silently, warn for a
    // non-empty one of another shape.
    at::native::resize_output(target, sizes);
  } catch (const c10::Error& e) {
    ctx->input_error = std::current_exception();
    return fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return publish_output(*ctx, index, target, out);
}

maxdev_status set_error(maxdev_host_context* ctx, const char* message) {
  if (ctx == nullptr) return MAXDEV_ERROR;
  std::string text = message != nullptr ? message : "(no message)";
  // A kernel reporting a failed host call ("resize_output(0) failed")
  // keeps the host's reason with it.
  if (ctx->host_failure) {
    text += ": " + ctx->error;
  } else {
    ctx->input_error = nullptr;  // the kernel failed for a reason of its own
  }
  ctx->error = std::move(text);
  ctx->host_failure = false;
  return MAXDEV_ERROR;
}

void log_message(maxdev_host_context* ctx, int32_t level, const char* message) {
  if (message == nullptr) return;
  const std::string who = ctx != nullptr && ctx->plugin != nullptr ? *ctx->plugin : "plugin";
  const int clamped = std::clamp(level, MAXDEV_LOG_TRACE, MAXDEV_LOG_ERROR);
  log::write(static_cast<log::Level>(clamped), who + ": " + message);
}

// PyTorch's intra-op pool, so torch.set_num_threads governs plugins too.
void parallel_for(maxdev_host_context* /*ctx*/, int64_t begin, int64_t end, int64_t grain,
                  void (*body)(void* user, int64_t begin, int64_t end), void* user) {
  if (body == nullptr || end <= begin) return;
  at::parallel_for(begin, end, std::max<int64_t>(grain, 1),
                   [body, user](int64_t b, int64_t e) { body(user, b, e); });
}

int32_t num_threads(maxdev_host_context* /*ctx*/) {
  return at::in_parallel_region() ? 1 : static_cast<int32_t>(at::get_num_threads());
}

const maxdev_host_api kHostApi = {
    sizeof(maxdev_host_api), MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR, &alloc_output, &set_error, &log_message,
    &resize_output, &parallel_for, &num_threads,
};

}  // namespace

const maxdev_host_api* host_api() { return &kHostApi; }

// Constant-initialized: no call can see it before it is filled.
constexpr std::array<AbiDtype, static_cast<size_t>(c10::ScalarType::NumOptions)> kAbiDtypes = [] {
  std::array<AbiDtype, static_cast<size_t>(c10::ScalarType::NumOptions)> by_type{};
  for (const auto& e : kDtypes) by_type[static_cast<size_t>(e.type)] = {e.abi, e.mask};
  return by_type;
}();

maxdev_tensor tensor_view(const at::Tensor& t, bool writable) {
  maxdev_tensor view;
  fill_tensor_view(*t.unsafeGetTensorImpl(), writable, view);
  return view;
}

bool to_abi_dtype(c10::ScalarType type, maxdev_dtype* out) {
  const auto index = static_cast<size_t>(type);
  if (index >= kAbiDtypes.size() || kAbiDtypes[index].mask == 0) return false;
  *out = kAbiDtypes[index].abi;
  return true;
}

std::optional<c10::ScalarType> from_abi_dtype(maxdev_dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.abi.code == dtype.code && e.abi.bits == dtype.bits && dtype.lanes == 1) return e.type;
  }
  return std::nullopt;
}

}  // namespace maxdev::dispatch
