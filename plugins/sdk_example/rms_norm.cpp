// sdk_example — a max_device plugin written with the C++ SDK (plugin.hpp).
//
//   myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
//       y = x / sqrt(mean(x^2 over the last dim) + eps) * weight
//       float32, contiguous x and weight (weight: [x.size(-1)]); declines
//       anything else.
//   aten::silu.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
//       silu is structured, so this one kernel also serves silu and silu_.
//       float32, contiguous.
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

void silu_out(maxdev::Call& call) {
  const maxdev::Tensor self = call.tensor(0);
  const maxdev::Tensor out = call.output(0);
  if (!device_f32_contiguous(self) || !device_f32_contiguous(out)) throw maxdev::Declined{};
  if (self.numel() != out.numel() || self.ndim() != out.ndim())
    throw maxdev::Error("aten::silu.out: out has the wrong shape");
  for (int64_t i = 0; i < self.ndim(); ++i)
    if (self.size(i) != out.size(i)) throw maxdev::Error("aten::silu.out: out has the wrong shape");
  call.state<State>().calls.fetch_add(1, std::memory_order_relaxed);

  // Contiguous and same shape: element i of one is element i of the other,
  // so out == self (silu_) is fine too.
  const float* xp = self.data<float>();
  float* yp = out.data<float>();
  const int64_t n = self.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = xp[i];
    yp[i] = static_cast<float>(v / (1.0 + std::exp(-v)));
  }
}

}  // namespace

#define SDK_EXAMPLE_KERNELS(K)                                                 \
  K("myplug::rms_norm", "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", \
    MAXDEV_SDK_KERNEL(rms_norm), MAXDEV_DTYPE_FLOAT32,                         \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY | MAXDEV_KERNEL_NO_CPU_TENSORS)              \
  K("aten::silu.out", "", MAXDEV_SDK_KERNEL(silu_out), MAXDEV_DTYPE_FLOAT32,  \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY | MAXDEV_KERNEL_NO_CPU_TENSORS)

MAXDEV_DEFINE_PLUGIN("sdk_example", "1.0.0", SDK_EXAMPLE_KERNELS, init, teardown)
