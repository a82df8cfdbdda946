// sdk_example — a max_device plugin written with the C++ SDK (plugin.hpp).
//
//   myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
//       y = x / sqrt(mean(x^2 over the last dim) + eps) * weight
//       float32, contiguous x and weight (weight: [x.size(-1)]); declines
//       anything else.
//       Its meta function gives FakeTensor and torch.compile the output's
//       shape without running the kernel.
//   myplug::swiglu(Tensor gate, Tensor up) -> Tensor
//       silu(gate) * up, float32 or float64, any strides (same shapes).
//       With a meta function and an autograd link to
//   myplug::swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)
//       (grad_gate, grad_up), so torch.autograd, FakeTensor and
//       torch.library.opcheck work on swiglu with no Python.
//   aten::silu.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
//       silu is structured, so this one kernel also serves silu and silu_.
//       float32, contiguous (declared: the host declines the rest); resizes
//       an explicit out= as PyTorch does.
//
// The plugin keeps a small state (from init, freed in teardown) that counts
// calls, to show Call::state<T>(); kernels may run on several threads at
// once, so the counter is atomic.
#include <max_device/plugin.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <new>

namespace {

struct State {
  std::atomic<int64_t> calls{0};
};

maxdev_status init(const maxdev_host_api* /*host*/, maxdev_host_context* /*ctx*/,
                   void** state) {
  // Nothing may throw across the C boundary: nothrow new.
  *state = new (std::nothrow) State();
  return *state != nullptr ? MAXDEV_OK : MAXDEV_ERROR;
}

void teardown(void* state) { delete static_cast<State*>(state); }

bool device_f32_contiguous(const maxdev::Tensor& t) {
  return !t.is_cpu() && t.has_dtype(maxdev::kFloat32) && t.is_contiguous();
}

void rms_norm(maxdev::Call& call) {
  const maxdev::Tensor x = call.tensor(0);
  const maxdev::Tensor weight = call.tensor(1);
  const double eps = call.real(2);
  if (!device_f32_contiguous(x) || !device_f32_contiguous(weight) || x.ndim() < 1)
    throw maxdev::Declined{};
  const int64_t d = x.size(-1);
  if (weight.ndim() != 1 || weight.size(0) != d)
    throw maxdev::Error("myplug::rms_norm: weight must have shape [" + std::to_string(d) +
                        "], the size of x's last dimension");
  call.state<State>().calls.fetch_add(1, std::memory_order_relaxed);

  maxdev::Tensor y = call.alloc_output(0, maxdev::kFloat32, x.shape());
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  float* yp = y.data<float>();
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    float* yr = yp + r * d;
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sq += static_cast<double>(xr[j]) * xr[j];
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j)
      yr[j] = static_cast<float>(static_cast<double>(xr[j]) * inv * wp[j]);
  }
}

// Shapes only: the output of rms_norm is shaped like x.
void rms_norm_meta(maxdev::Call& call) {
  const maxdev::Tensor x = call.tensor(0);
  call.alloc_output(0, x.dtype(), x.shape());
}

// gate and up must have one shape (the backward would otherwise have to
// reduce over broadcast dimensions).
void check_same_shape(const char* op, const maxdev::Tensor& a, const maxdev::Tensor& b) {
  bool same = a.ndim() == b.ndim();
  for (int64_t d = 0; same && d < a.ndim(); ++d) same = a.size(d) == b.size(d);
  if (!same || !maxdev::same_dtype(a.dtype(), b.dtype()))
    throw maxdev::Error(std::string(op) + ": gate and up must have the same shape and dtype");
}

template <typename T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

void swiglu_meta(maxdev::Call& call) {
  const maxdev::Tensor gate = call.tensor(0), up = call.tensor(1);
  check_same_shape("myplug::swiglu", gate, up);
  call.alloc_output(0, gate.dtype(), gate.shape());
}

void swiglu(maxdev::Call& call) {
  const maxdev::Tensor gate = call.tensor(0), up = call.tensor(1);
  check_same_shape("myplug::swiglu", gate, up);
  const maxdev::Tensor y = call.alloc_output(0, gate.dtype(), gate.shape());
  maxdev::dispatch_floating(gate.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    maxdev::elementwise<T>(y, [](T g, T u) { return g * sigmoid(g) * u; }, gate, up);
  });
}

void swiglu_backward_meta(maxdev::Call& call) {
  const maxdev::Tensor gate = call.tensor(1), up = call.tensor(2);
  check_same_shape("myplug::swiglu_backward", gate, up);
  call.alloc_output(0, gate.dtype(), gate.shape());
  call.alloc_output(1, gate.dtype(), gate.shape());
}

void swiglu_backward(maxdev::Call& call) {
  const maxdev::Tensor grad = call.tensor(0), gate = call.tensor(1), up = call.tensor(2);
  check_same_shape("myplug::swiglu_backward", gate, up);
  check_same_shape("myplug::swiglu_backward", grad, gate);
  const maxdev::Tensor grad_gate = call.alloc_output(0, gate.dtype(), gate.shape());
  const maxdev::Tensor grad_up = call.alloc_output(1, gate.dtype(), gate.shape());
  maxdev::dispatch_floating(gate.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    maxdev::elementwise<T>(grad_gate, [](T dy, T g, T u) {
      const T s = sigmoid(g);
      return dy * u * s * (T(1) + g * (T(1) - s));
    }, grad, gate, up);
    maxdev::elementwise<T>(grad_up, [](T dy, T g) { return dy * g * sigmoid(g); }, grad, gate);
  });
}

void silu_out(maxdev::Call& call) {
  const maxdev::Tensor self = call.tensor(0);
  if (self.is_cpu()) throw maxdev::Declined{};
  // An explicit out= arrives as the user passed it: resize it as PyTorch does.
  const maxdev::Tensor out = call.resize_output(0, self.shape());
  maxdev::check_no_partial_overlap(out, {self});
  call.state<State>().calls.fetch_add(1, std::memory_order_relaxed);
  maxdev::dispatch_floating(self.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    maxdev::elementwise<T>(out, [](T v) { return v * sigmoid(v); }, self);
  });
}

}  // namespace

#define SDK_EXAMPLE_KERNELS(K)                                                 \
  K("myplug::rms_norm", "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", \
    MAXDEV_SDK_KERNEL(rms_norm), MAXDEV_DTYPE_FLOAT32,                         \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY | MAXDEV_KERNEL_NO_CPU_TENSORS, MAXDEV_SDK_KERNEL(rms_norm_meta)) \
  K("myplug::swiglu", "myplug::swiglu(Tensor gate, Tensor up) -> Tensor",     \
    MAXDEV_SDK_KERNEL(swiglu), MAXDEV_DTYPE_FLOAT32 | MAXDEV_DTYPE_FLOAT64,    \
    MAXDEV_KERNEL_NO_CPU_TENSORS, MAXDEV_SDK_KERNEL(swiglu_meta), "myplug::swiglu_backward") \
  K("myplug::swiglu_backward",                                                 \
    "myplug::swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)", \
    MAXDEV_SDK_KERNEL(swiglu_backward), MAXDEV_DTYPE_FLOAT32 | MAXDEV_DTYPE_FLOAT64, \
    MAXDEV_KERNEL_NO_CPU_TENSORS, MAXDEV_SDK_KERNEL(swiglu_backward_meta))     \
  K("aten::silu.out", "", MAXDEV_SDK_KERNEL(silu_out), MAXDEV_DTYPE_FLOAT32,  \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY | MAXDEV_KERNEL_NO_CPU_TENSORS)

MAXDEV_DEFINE_PLUGIN("sdk_example", "1.0.0", SDK_EXAMPLE_KERNELS, init, teardown)
