// The floor for a PrivateUse1 kernel: aten::add.out for max_device compiled
// straight against libtorch and registered with TORCH_LIBRARY_IMPL, no
// loader, no plugin ABI. bench_plugin_call.py loads it with
// torch.ops.load_library into a process that imported max_device but loaded
// no plugin, and compares torch.add through it with torch.add through the
// reference plugin.
//
// The body is the same simple float loop as the plugin's add (float32,
// equal shapes, contiguous: out[i] = a[i] + alpha * b[i]) and it counts its
// calls with a relaxed atomic, as the loader counts a layer's calls, so the
// difference between the two paths is the trampoline and the C ABI.
// Anything else is refused: this is a benchmark kernel, not a product.
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>

namespace {

std::atomic<int64_t> g_calls{0};

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  TORCH_CHECK(self.scalar_type() == at::kFloat && other.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kFloat,
              "bench native add.out: float32 only");
  TORCH_CHECK(self.sizes().equals(other.sizes()) && self.sizes().equals(out.sizes()),
              "bench native add.out: equal shapes only");
  TORCH_CHECK(self.is_contiguous() && other.is_contiguous() && out.is_contiguous(),
              "bench native add.out: contiguous tensors only");
  const float a = alpha.toFloat();
  const float* x = self.const_data_ptr<float>();
  const float* y = other.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  const int64_t n = self.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + a * y[i];
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("add.out", TORCH_FN(add_out)); }

// Read with ctypes to prove the kernel ran.
extern "C" __attribute__((visibility("default"))) int64_t bench_native_add_calls() {
  return g_calls.load(std::memory_order_relaxed);
}
