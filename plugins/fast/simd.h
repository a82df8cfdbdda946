// The fast plugin's compute kernels: plain functions over contiguous float
// rows, compiled once per instruction set (simd_kernels.cpp, built as
// AVX-512, AVX2+FMA and baseline objects) and picked at load time by what
// the CPU supports. Threading and argument checks live in fast.cpp; these
// run on one thread over the range they are given.
#ifndef MAX_DEVICE_FAST_SIMD_H_
#define MAX_DEVICE_FAST_SIMD_H_

#include <cstdint>

namespace fast {

enum class BinaryOp : int { kAdd, kSub, kMul, kDiv };

// One AdamW step's constants (PyTorch's _fused_adamw_, amsgrad off):
//   param *= decay (1 - lr * weight_decay)
//   exp_avg += (1 - beta1) * (grad - exp_avg)
//   exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2
//   param -= step_size * exp_avg / (sqrt(exp_avg_sq) / bias_correction2_sqrt + eps)
struct AdamWStep {
  float decay, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_bias_correction2_sqrt, eps;
  bool maximize;  // grad -> -grad
};

// GEMM blocking: C[MR x NR] tiles, K in KC slices, packed panels.
constexpr int64_t kGemmMR = 12;
constexpr int64_t kGemmNR = 32;
constexpr int64_t kGemmKC = 256;

struct Kernels {
  const char* isa;
  // out[i] = a[i] op alpha * b[i], where a null operand is its float32
  // scalar (a_scalar, b_scalar). alpha applies to add and sub only.
  void (*binary)(BinaryOp op, const float* a, float a_scalar, const float* b, float b_scalar, float alpha,
                 float* out, int64_t n);
  // The same over bfloat16, computed in float32 and rounded once.
  void (*binary_bf16)(BinaryOp op, const uint16_t* a, float a_scalar, const uint16_t* b, float b_scalar,
                      float alpha, uint16_t* out, int64_t n);
  void (*relu)(const float* in, float* out, int64_t n);
  // grad_in = x > threshold ? grad : 0 (threshold_backward).
  void (*threshold_backward)(const float* grad, const float* x, float threshold, float* out,
                             int64_t n);
  void (*gelu)(const float* in, float* out, int64_t n, bool tanh_approx);
  void (*gelu_backward)(const float* grad, const float* x, float* out, int64_t n,
                        bool tanh_approx);
  float (*sum)(const float* in, int64_t n);
  // acc[i] += in[i]
  void (*accumulate)(float* acc, const float* in, int64_t n);
  void (*scale)(float* data, float factor, int64_t n);
  // One row of (log_)softmax and its backward (out: the forward's output).
  // `stream`: the row's output bypasses the cache (as for layer norm
  // below); softmax then keeps its exponentials in `scratch` (n floats).
  void (*softmax)(const float* in, float* out, int64_t n, bool log, float* scratch, bool stream);
  void (*softmax_backward)(const float* grad, const float* out, float* grad_in, int64_t n,
                           bool log, bool stream);
  // One row of layer norm: y = (x - mean) * rstd * w + b (w, b may be
  // null); stores the row's mean and rstd = 1 / sqrt(var + eps). `stream`:
  // y bypasses the cache (a large output only evicts the inputs).
  void (*layer_norm)(const float* x, const float* w, const float* b, float eps, float* y, int64_t n,
                     float* mean, float* rstd, bool stream);
  // One row of its backward, with g = dy * w (dy if w is null) and
  // xhat = (x - mean) * rstd: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
  // dw_acc += dy * xhat, db_acc += dy; `stream` as above, for dx.
  void (*layer_norm_backward)(const float* dy, const float* x, float mean, float rstd, const float* w,
                              float* dx, float* dw_acc, float* db_acc, int64_t n, bool stream);
  void (*adamw)(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWStep& c);
  void (*bf16_to_f32)(const uint16_t* in, float* out, int64_t n);
  void (*f32_to_bf16)(const float* in, uint16_t* out, int64_t n);
  // panel[p * width + r] = src[r * ld + p] for r < rows, p < k; zero for
  // rows <= r < width (a row-major A block, or a transposed B, as panels).
  void (*pack_transposed)(const float* src, int64_t ld, int64_t rows, int64_t k, int64_t width, float* panel);
  // C[mr x nr] (+)= alpha * A_panel * B_panel over k, for packed panels
  // (A: k x MR, B: k x NR); `add`: accumulate into C, else overwrite.
  void (*gemm_tile)(int64_t k, const float* a_panel, const float* b_panel, float* c, int64_t ldc,
                    int64_t mr, int64_t nr, float alpha, bool add);
};

const Kernels& kernels_avx512();
const Kernels& kernels_avx2();
const Kernels& kernels_baseline();

}  // namespace fast

#endif  // MAX_DEVICE_FAST_SIMD_H_
