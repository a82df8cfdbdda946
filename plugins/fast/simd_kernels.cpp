// The fast plugin's compute kernels (see simd.h), written once with GCC/Clang
// vector extensions and compiled three times (plugins/fast/CMakeLists.txt):
// FAST_ISA=avx512 (-mavx512f ...), avx2 (-mavx2 -mfma), baseline. Each copy
// lives in its own namespace and includes no C++ library templates, so no
// inline function compiled for one instruction set can be merged into
// another copy by the linker.
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "simd.h"

#if !defined(FAST_ISA)
#error "FAST_ISA must be avx512, avx2 or baseline"
#endif

#define FAST_CAT2_(a, b) a##b
#define FAST_CAT_(a, b) FAST_CAT2_(a, b)

namespace fast {
namespace FAST_CAT_(isa_, FAST_ISA) {
namespace {

// Floats per vector: one register of the instruction set. (A vector wider
// than the registers is not split well: GCC turned 16-float comparisons
// into scalar code for AVX2, 10x slower than the CPU's kernels.)
#if defined(__AVX512F__)
constexpr int64_t W = 16;
#elif defined(__AVX2__)
constexpr int64_t W = 8;
#else
constexpr int64_t W = 4;
#endif
typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef float vf_u __attribute__((vector_size(W * 4), aligned(4)));  // unaligned loads/stores

inline vf load(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_u*>(p) = v; }
// A broadcast: x - 0.0 is x for every x, -0.0 included (x + vf{} is not:
// -0.0 + 0.0 is 0.0), so the subtraction folds away and one broadcast is
// left, at any width.
inline vf splat(float x) { return x - vf{}; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}
inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Outputs of at least this many bytes bypass the cache (streaming stores):
// they would only evict the inputs.
constexpr int64_t kStreamBytes = int64_t{4} << 20;

// Stores a whole vector, streaming where asked and supported (p aligned).
inline void store_out(float* p, vf v, bool stream) {
#if defined(__AVX512F__)
  if (stream) {
    _mm512_stream_ps(p, reinterpret_cast<__m512>(v));
    return;
  }
#else
  (void)stream;
#endif
  store(p, v);
}

inline void stream_fence(bool stream) {
#if defined(__AVX512F__)
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

// Runs f(i, vector, stream) over [0, n): single elements until out is
// 64-byte aligned when streaming, then whole vectors, then a tail of single
// elements.
template <typename F>
inline void for_vectors(float* out, int64_t n, F f) {
  const bool stream = n * 4 >= kStreamBytes;
  int64_t i = 0;
  if (stream) {
    while (i < n && (reinterpret_cast<uintptr_t>(out + i) & 63) != 0) f(i++, false, false);
  }
  for (; i + W <= n; i += W) f(i, true, stream);
  for (; i < n; ++i) f(i, false, false);
  stream_fence(stream);
}

// exp(x) = 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2: Cephes'
// polynomial after a two-step reduction, relative error ~2e-7. Returns p(r)
// and n (a whole number, as a float), for x within [-103.97, 88.72].
inline vf exp_reduced(vf x, vf* n_out) {
#if defined(__AVX512F__)
  const vf n = reinterpret_cast<vf>(_mm512_roundscale_ps(reinterpret_cast<__m512>(x * 1.44269504088896341f),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  const vf shifter = splat(12582912.f);  // 1.5 * 2^23: rounds to nearest
  const vf n = (x * 1.44269504088896341f + shifter) - shifter;
#endif
  vf r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // The polynomial in Estrin's scheme: three dependent steps where
  // Horner's takes six, so more elements are in flight at once.
  const vf r2 = r * r, r4 = r2 * r2;
  const vf c01 = 1.6666665459e-1f * r + 5.0000001201e-1f;
  const vf c23 = 8.3334519073e-3f * r + 4.1665795894e-2f;
  const vf c45 = 1.9875691500e-4f * r + 1.3981999507e-3f;
  const vf p = (c45 * r4 + (c23 * r2 + c01));
  *n_out = n;
  return p * r2 + (r + 1.f);
}

#if !defined(__AVX512F__)
inline vf pow2(vi n) {
  const vi bits = (n + 127) << 23;
  vf f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
#endif

// p * 2^n for a whole n in [-150, 128]: AVX-512's scalef in one
// instruction (subnormal results rounded, 2^128 overflowing to inf); else
// 2^n in two halves, so that n below -126 stays representable.
inline vf scale_by_pow2(vf p, vf n) {
#if defined(__AVX512F__)
  return reinterpret_cast<vf>(_mm512_scalef_ps(reinterpret_cast<__m512>(p), reinterpret_cast<__m512>(n)));
#else
  const vi ni = __builtin_convertvector(n, vi);
  const vi n1 = ni >> 1;
  return p * pow2(n1) * pow2(ni - n1);
#endif
}

// The same for n in [-126, 127], where 2^n is a normal float.
inline vf scale_by_normal_pow2(vf p, vf n) {
#if defined(__AVX512F__)
  return scale_by_pow2(p, n);
#else
  return p * pow2(__builtin_convertvector(n, vi));
#endif
}

// exp(x) over float's whole range: below the smallest subnormal -> 0 (so
// exp(-inf) is 0), overflow -> inf, NaN -> NaN.
inline vf vexp(vf x0) {
  const vf hi = splat(88.7228f), lo = splat(-103.97f);
  vf n;
  const vf p = exp_reduced(vmin(vmax(x0, lo), hi), &n);
  vf result = scale_by_pow2(p, n);
  result = x0 > hi ? splat(__builtin_inff()) : result;
  result = x0 < lo ? splat(0.f) : result;
  return x0 != x0 ? x0 : result;
}

inline float sexp(float x) { return vexp(splat(x))[0]; }

// exp(x) for x <= 0 (softmax's x - max, erf's -x^2) at two thirds of
// vexp's cost: results below float's smallest normal flush to 0 (as the
// CPU's softmax, whose exp flushes below the same bound). NaN comes out
// finite: callers see to NaN themselves.
inline vf vexp_nonpositive(vf x) {
  const vf lo = splat(-87.33654f);  // ln(smallest normal)
  vf n;
  const vf p = exp_reduced(vmax(x, lo), &n);
  return x < lo ? splat(0.f) : scale_by_normal_pow2(p, n);
}

// 1 / d to float precision: a division is ~10x the cost of a multiply, so
// AVX-512 takes its 14-bit reciprocal estimate and one Newton step.
inline vf vrecip(vf d) {
#if defined(__AVX512F__)
  const vf r = reinterpret_cast<vf>(_mm512_maskz_rcp14_ps(0xffff, reinterpret_cast<__m512>(d)));
  return r * (2.f - d * r);
#else
  return 1.f / d;
#endif
}

// erf(x), absolute error < 2e-7 (Abramowitz & Stegun 7.1.26).
inline vf verf(vf x) {
  const vf ax = vmax(x, -x);
  const vf t = vrecip(1.f + 0.3275911f * ax);
  const vf t2 = t * t;  // the polynomial in Estrin's scheme, as in exp_reduced
  const vf p = 1.061405429f * (t2 * t2) + ((1.421413741f - 1.453152027f * t) * t2 + (0.254829592f - 0.284496736f * t));
  const vf y = 1.f - p * t * vexp_nonpositive(-ax * ax);  // x NaN: t is NaN
  return x < 0.f ? -y : y;
}

inline vf vtanh(vf x) {
  // 1 - 2 / (exp(2x) + 1), with small |x| by its series (no cancellation).
  const vf e = vexp(2.f * vmin(vmax(x, splat(-20.f)), splat(20.f)));
  const vf big = 1.f - 2.f * vrecip(e + 1.f);
  const vf x2 = x * x;
  const vf small = x * (1.f + x2 * (-1.f / 3 + x2 * (2.f / 15 + x2 * (-17.f / 315))));
  const vf ax = vmax(x, -x);
  return ax < 0.125f ? small : big;
}

constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float k2OverSqrtPi = 1.12837916709551257f;

inline vf gelu_v(vf x, bool tanh_approx) {
  if (tanh_approx) {
    const vf inner = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + vtanh(inner));
  }
  return 0.5f * x * (1.f + verf(x * kSqrt1_2));
}

inline vf gelu_grad_v(vf g, vf x, bool tanh_approx) {
  if (tanh_approx) {
    const vf x2 = x * x;
    const vf inner = kSqrt2OverPi * (x + 0.044715f * x2 * x);
    const vf t = vtanh(inner);
    const vf dinner = kSqrt2OverPi * (1.f + 3.f * 0.044715f * x2);
    return g * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner);
  }
  const vf cdf = 0.5f * (1.f + verf(x * kSqrt1_2));
  const vf pdf = (k2OverSqrtPi * kSqrt1_2 * 0.5f) * vexp_nonpositive(-0.5f * x * x);  // x NaN: cdf is NaN
  return g * (cdf + x * pdf);
}

// ---------------------------------------------------------------------------

template <BinaryOp Op>
inline vf apply(vf a, vf b, float alpha) {
  switch (Op) {
    case BinaryOp::kAdd: return a + alpha * b;
    case BinaryOp::kSub: return a - alpha * b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
  }
  return a;
}

// bfloat16 element i of p as float32, and float32 rounded to bfloat16
// (nearest even; NaN stays a quiet NaN), one value or a vector at a time.
inline float to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded);
}

typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef uint16_t vh_u __attribute__((vector_size(W * 2), aligned(2)));

inline vf load(const uint16_t* p) {
  const vu bits = __builtin_convertvector(*reinterpret_cast<const vh_u*>(p), vu) << 16;
  vf f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void store(uint16_t* p, vf v) {
  vu bits;
  std::memcpy(&bits, &v, sizeof bits);
  const vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const vu quiet = (bits >> 16) | 0x40u;
  const vu h = (bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  *reinterpret_cast<vh_u*>(p) = __builtin_convertvector(h, vh_u);
}

inline float to_f32(float f) { return f; }

// Element type T (float, or uint16_t holding bfloat16) computed in float32:
// out[i] = a[i] op alpha * b[i], a null operand being its float32 scalar.
template <BinaryOp Op, class T>
void binary_op(const T* a, float a_scalar, const T* b, float b_scalar, float alpha, T* out, int64_t n) {
  // add/sub with alpha == 1 skip the multiply (exactly what the CPU computes).
  const bool unit = alpha == 1.f;
  auto compute = [&](auto x, auto y) {
    if (unit && Op == BinaryOp::kAdd) return x + y;
    if (unit && Op == BinaryOp::kSub) return x - y;
    switch (Op) {
      case BinaryOp::kAdd: return x + alpha * y;
      case BinaryOp::kSub: return x - alpha * y;
      case BinaryOp::kMul: return x * y;
      default: return x / y;
    }
  };
  auto element = [&](int64_t i) {
    const float r = compute(a ? to_f32(a[i]) : a_scalar, b ? to_f32(b[i]) : b_scalar);
    if constexpr (std::is_same_v<T, float>) out[i] = r;
    else out[i] = to_bf16(r);
  };
  if constexpr (std::is_same_v<T, float>) {
    for_vectors(out, n, [&](int64_t i, bool vec, bool stream) {
      if (!vec) return element(i);
      store_out(out + i, compute(a ? load(a + i) : splat(a_scalar), b ? load(b + i) : splat(b_scalar)), stream);
    });
  } else {
    int64_t i = 0;
    for (; i + W <= n; i += W) store(out + i, compute(a ? load(a + i) : splat(a_scalar), b ? load(b + i) : splat(b_scalar)));
    for (; i < n; ++i) element(i);
  }
}

template <class T>
void binary_t(BinaryOp op, const T* a, float a_scalar, const T* b, float b_scalar, float alpha, T* out, int64_t n) {
  switch (op) {
    case BinaryOp::kAdd: return binary_op<BinaryOp::kAdd>(a, a_scalar, b, b_scalar, alpha, out, n);
    case BinaryOp::kSub: return binary_op<BinaryOp::kSub>(a, a_scalar, b, b_scalar, alpha, out, n);
    case BinaryOp::kMul: return binary_op<BinaryOp::kMul>(a, a_scalar, b, b_scalar, alpha, out, n);
    case BinaryOp::kDiv: return binary_op<BinaryOp::kDiv>(a, a_scalar, b, b_scalar, alpha, out, n);
  }
}

void binary(BinaryOp op, const float* a, float a_scalar, const float* b, float b_scalar, float alpha, float* out,
            int64_t n) {
  binary_t(op, a, a_scalar, b, b_scalar, alpha, out, n);
}

void binary_bf16(BinaryOp op, const uint16_t* a, float a_scalar, const uint16_t* b, float b_scalar, float alpha,
                 uint16_t* out, int64_t n) {
  binary_t(op, a, a_scalar, b, b_scalar, alpha, out, n);
}

void relu(const float* in, float* out, int64_t n) {
  for_vectors(out, n, [&](int64_t i, bool vec, bool stream) {
    if (vec) {
      const vf x = load(in + i);
      // NaN stays NaN, as in PyTorch (x > 0 is false for NaN; keep x then).
      store_out(out + i, x < 0.f ? splat(0.f) : x, stream);
    } else {
      out[i] = in[i] < 0.f ? 0.f : in[i];
    }
  });
}

void threshold_backward(const float* grad, const float* x, float threshold, float* out,
                        int64_t n) {
  for_vectors(out, n, [&](int64_t i, bool vec, bool stream) {
    if (vec) store_out(out + i, load(x + i) <= threshold ? splat(0.f) : load(grad + i), stream);
    else out[i] = x[i] <= threshold ? 0.f : grad[i];
  });
}

void gelu(const float* in, float* out, int64_t n, bool tanh_approx) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, gelu_v(load(in + i), tanh_approx));
  for (; i < n; ++i) out[i] = gelu_v(splat(in[i]), tanh_approx)[0];
}

void gelu_backward(const float* grad, const float* x, float* out, int64_t n, bool tanh_approx) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, gelu_grad_v(load(grad + i), load(x + i), tanh_approx));
  for (; i < n; ++i) out[i] = gelu_grad_v(splat(grad[i]), splat(x[i]), tanh_approx)[0];
}

float sum(const float* in, int64_t n) {
  vf s0{}, s1{}, s2{}, s3{};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    s0 += load(in + i);
    s1 += load(in + i + W);
    s2 += load(in + i + 2 * W);
    s3 += load(in + i + 3 * W);
  }
  for (; i + W <= n; i += W) s0 += load(in + i);
  float s = hsum((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) s += in[i];
  return s;
}

void accumulate(float* acc, const float* in, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(acc + i, load(acc + i) + load(in + i));
  for (; i < n; ++i) acc[i] += in[i];
}

void scale(float* data, float factor, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(data + i, load(data + i) * factor);
  for (; i < n; ++i) data[i] *= factor;
}

float row_max(const float* in, int64_t n) {
  float m = -__builtin_inff();
  int64_t i = 0;
  if (n >= W) {
    vf vm = load(in);
    for (i = W; i + W <= n; i += W) {
      const vf x = load(in + i);
      vm = (x > vm) | (x != x) ? x : vm;  // NaN propagates
    }
    m = hmax(vm);
    for (int k = 0; k < W; ++k)
      if (vm[k] != vm[k]) m = vm[k];
  }
  for (; i < n; ++i) m = in[i] > m || in[i] != in[i] ? in[i] : m;
  return m;
}

float slog(float x) { return __builtin_logf(x); }

// Runs f(i, vector, stream) over a row [0, n) whose output is `out`,
// streaming the whole vectors when asked and out is 64-byte aligned.
template <typename F>
inline void for_row(float* out, int64_t n, bool stream, F f) {
  stream = stream && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  int64_t i = 0;
  for (; i + W <= n; i += W) f(i, true, stream);
  for (; i < n; ++i) f(i, false, false);
  stream_fence(stream);
}

void softmax(const float* in, float* out, int64_t n, bool log, float* scratch, bool stream) {
  // As on the CPU, a row with a NaN or whose max is infinite (all -inf,
  // or +inf) comes out NaN: inf - inf.
  const float shift = row_max(in, n);
  if (!__builtin_isfinite(shift)) {  // NaN in the row, or an infinite max
    for (int64_t j = 0; j < n; ++j) out[j] = __builtin_nanf("");
    return;
  }
  // softmax keeps exp(x - max) until the sum is known: in `out` itself,
  // or, when out is streamed, in `scratch` (a row that stays in cache).
  float* e_row = log ? nullptr : (stream ? scratch : out);
  vf vs{};
  float s = 0.f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf e = vexp_nonpositive(load(in + i) - shift);
    if (!log) store(e_row + i, e);
    vs += e;
  }
  for (; i < n; ++i) {
    const float e = sexp(in[i] - shift);
    if (!log) e_row[i] = e;
    s += e;
  }
  s += hsum(vs);
  if (log) {
    // (x - max) - log(sum), as the CPU: x - (max + log(sum)) would round
    // the sum of the two (an ulp of a large max) into every output.
    const float log_s = slog(s);
    for_row(out, n, stream, [&](int64_t j, bool vec, bool streamed) {
      if (vec) {
        store_out(out + j, (load(in + j) - shift) - log_s, streamed);
      } else {
        out[j] = (in[j] - shift) - log_s;
      }
    });
  } else {
    const float inv = 1.f / s;
    for_row(out, n, stream, [&](int64_t j, bool vec, bool streamed) {
      if (vec) {
        store_out(out + j, load(e_row + j) * inv, streamed);
      } else {
        out[j] = e_row[j] * inv;
      }
    });
  }
}

void softmax_backward(const float* grad, const float* out, float* grad_in, int64_t n, bool log, bool stream) {
  vf vs{};
  float s = 0.f;
  int64_t i = 0;
  if (log) {  // grad - exp(out) * sum(grad)
    for (; i + W <= n; i += W) vs += load(grad + i);
    for (; i < n; ++i) s += grad[i];
    s += hsum(vs);
    for_row(grad_in, n, stream, [&](int64_t j, bool vec, bool streamed) {
      if (vec) {
        store_out(grad_in + j, load(grad + j) - vexp(load(out + j)) * s, streamed);
      } else {
        grad_in[j] = grad[j] - sexp(out[j]) * s;
      }
    });
  } else {  // out * (grad - sum(grad * out))
    for (; i + W <= n; i += W) vs += load(grad + i) * load(out + i);
    for (; i < n; ++i) s += grad[i] * out[i];
    s += hsum(vs);
    for_row(grad_in, n, stream, [&](int64_t j, bool vec, bool streamed) {
      if (vec) {
        store_out(grad_in + j, load(out + j) * (load(grad + j) - s), streamed);
      } else {
        grad_in[j] = out[j] * (grad[j] - s);
      }
    });
  }
}

void layer_norm(const float* x, const float* w, const float* b, float eps, float* y, int64_t n, float* mean_out,
                float* rstd_out, bool stream) {
  const float mean = sum(x, n) / static_cast<float>(n);
  vf q0{}, q1{};
  float q = 0.f;
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const vf d0 = load(x + i) - mean, d1 = load(x + i + W) - mean;
    q0 += d0 * d0;
    q1 += d1 * d1;
  }
  for (; i + W <= n; i += W) {
    const vf d = load(x + i) - mean;
    q0 += d * d;
  }
  for (; i < n; ++i) q += (x[i] - mean) * (x[i] - mean);
  q += hsum(q0 + q1);
  const float rstd = 1.f / __builtin_sqrtf(q / static_cast<float>(n) + eps);
  for_row(y, n, stream, [&](int64_t j, bool vec, bool streamed) {
    if (vec) {
      vf v = (load(x + j) - mean) * rstd;
      if (w != nullptr) v *= load(w + j);
      if (b != nullptr) v += load(b + j);
      store_out(y + j, v, streamed);
      return;
    }
    float v = (x[j] - mean) * rstd;
    if (w != nullptr) v *= w[j];
    if (b != nullptr) v += b[j];
    y[j] = v;
  });
  *mean_out = mean;
  *rstd_out = rstd;
}

void layer_norm_backward(const float* dy, const float* x, float mean, float rstd, const float* w, float* dx,
                         float* dw_acc, float* db_acc, int64_t n, bool stream) {
  vf vg{}, vgx{};
  float sg = 0.f, sgx = 0.f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf d = load(dy + i), xhat = (load(x + i) - mean) * rstd;
    const vf g = w != nullptr ? d * load(w + i) : d;
    vg += g;
    vgx += g * xhat;
    if (dw_acc != nullptr) store(dw_acc + i, load(dw_acc + i) + d * xhat);
    if (db_acc != nullptr) store(db_acc + i, load(db_acc + i) + d);
  }
  for (; i < n; ++i) {
    const float xhat = (x[i] - mean) * rstd, g = w != nullptr ? dy[i] * w[i] : dy[i];
    sg += g;
    sgx += g * xhat;
    if (dw_acc != nullptr) dw_acc[i] += dy[i] * xhat;
    if (db_acc != nullptr) db_acc[i] += dy[i];
  }
  if (dx == nullptr) return;
  const float inv_n = 1.f / static_cast<float>(n);
  const float mg = (sg + hsum(vg)) * inv_n, mgx = (sgx + hsum(vgx)) * inv_n;
  for_row(dx, n, stream, [&](int64_t j, bool vec, bool streamed) {
    if (vec) {
      const vf d = load(dy + j), xhat = (load(x + j) - mean) * rstd;
      const vf g = w != nullptr ? d * load(w + j) : d;
      store_out(dx + j, rstd * (g - mg - xhat * mgx), streamed);
      return;
    }
    const float xhat = (x[j] - mean) * rstd, g = w != nullptr ? dy[j] * w[j] : dy[j];
    dx[j] = rstd * (g - mg - xhat * mgx);
  });
}

inline vf vsqrt(vf x) {
#if defined(__AVX512F__)
  return reinterpret_cast<vf>(_mm512_maskz_sqrt_ps(0xffff, reinterpret_cast<__m512>(x)));
#else
  vf r;
  for (int i = 0; i < W; ++i) r[i] = __builtin_sqrtf(x[i]);
  return r;
#endif
}

void adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWStep& c) {
  const float sign = c.maximize ? -1.f : 1.f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf g = load(grad + i) * sign;
    const vf p = load(param + i) * c.decay;
    vf m = load(exp_avg + i), v = load(exp_avg_sq + i);
    m += c.one_minus_beta1 * (g - m);
    v = c.beta2 * v + c.one_minus_beta2 * g * g;
    store(exp_avg + i, m);
    store(exp_avg_sq + i, v);
    store(param + i, p - c.step_size * m / (vsqrt(v) * c.inv_bias_correction2_sqrt + c.eps));
  }
  for (; i < n; ++i) {
    const float g = grad[i] * sign;
    const float p = param[i] * c.decay;
    float m = exp_avg[i], v = exp_avg_sq[i];
    m += c.one_minus_beta1 * (g - m);
    v = c.beta2 * v + c.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - c.step_size * m / (__builtin_sqrtf(v) * c.inv_bias_correction2_sqrt + c.eps);
  }
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, load(in + i));
  for (; i < n; ++i) out[i] = to_f32(in[i]);
}

void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, load(in + i));
  for (; i < n; ++i) out[i] = to_bf16(in[i]);
}

// 4 x 4 transposes within each 128-bit lane of four vectors: lane L of
// out[c] holds element 4L + c of in[0..3].
#if defined(__AVX512F__)
#define FAST_LANES_(f) f(0), f(1), f(2), f(3)
#elif defined(__AVX2__)
#define FAST_LANES_(f) f(0), f(1)
#else
#define FAST_LANES_(f) f(0)
#endif
#define FAST_LO_PS_(L) 4 * L, W + 4 * L, 4 * L + 1, W + 4 * L + 1
#define FAST_HI_PS_(L) 4 * L + 2, W + 4 * L + 2, 4 * L + 3, W + 4 * L + 3
#define FAST_LO_PD_(L) 4 * L, 4 * L + 1, W + 4 * L, W + 4 * L + 1
#define FAST_HI_PD_(L) 4 * L + 2, 4 * L + 3, W + 4 * L + 2, W + 4 * L + 3
inline void transpose_lanes(const vf in[4], vf out[4]) {
  const vf t0 = __builtin_shufflevector(in[0], in[1], FAST_LANES_(FAST_LO_PS_));
  const vf t1 = __builtin_shufflevector(in[0], in[1], FAST_LANES_(FAST_HI_PS_));
  const vf t2 = __builtin_shufflevector(in[2], in[3], FAST_LANES_(FAST_LO_PS_));
  const vf t3 = __builtin_shufflevector(in[2], in[3], FAST_LANES_(FAST_HI_PS_));
  out[0] = __builtin_shufflevector(t0, t2, FAST_LANES_(FAST_LO_PD_));
  out[1] = __builtin_shufflevector(t0, t2, FAST_LANES_(FAST_HI_PD_));
  out[2] = __builtin_shufflevector(t1, t3, FAST_LANES_(FAST_LO_PD_));
  out[3] = __builtin_shufflevector(t1, t3, FAST_LANES_(FAST_HI_PD_));
}
#undef FAST_LO_PS_
#undef FAST_HI_PS_
#undef FAST_LO_PD_
#undef FAST_HI_PD_
#undef FAST_LANES_

// panel[p * width + r] = src[r * ld + p] for r < rows, p < k, and zero for
// rows <= r < width: a row-major block of A (or a transposed B) into the
// k-major panels gemm_tile reads. Four rows at a time are read a vector at
// a time and transposed in registers, each 4 x 4 square stored as four
// 16-byte runs of the panel: a tenth of the scalar copy's loads and a
// quarter of its stores (packing was a quarter of a 256 x 256 x 64 GEMM).
void pack_transposed(const float* src, int64_t ld, int64_t rows, int64_t k, int64_t width, float* panel) {
  typedef float v4 __attribute__((vector_size(16), aligned(4)));
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* s = src + r * ld;
    int64_t p = 0;
    for (; p + W <= k; p += W) {
      const vf in[4] = {load(s + p), load(s + ld + p), load(s + 2 * ld + p), load(s + 3 * ld + p)};
      vf out[4];
      transpose_lanes(in, out);
#pragma GCC unroll 4
      for (int lane = 0; lane < W / 4; ++lane)
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          v4 column;
          std::memcpy(&column, reinterpret_cast<const float*>(&out[c]) + 4 * lane, 16);
          *reinterpret_cast<v4*>(panel + (p + 4 * lane + c) * width + r) = column;
        }
    }
    for (; p < k; ++p)
      for (int64_t i = 0; i < 4; ++i) panel[p * width + r + i] = s[i * ld + p];
  }
  for (; r < rows; ++r)
    for (int64_t p = 0; p < k; ++p) panel[p * width + r] = src[r * ld + p];
  if (rows < width)
    for (int64_t p = 0; p < k; ++p) std::memset(panel + p * width + rows, 0, static_cast<size_t>(width - rows) * 4);
}

// C tile (+)= alpha * A_panel (k x MR, MR floats per k) * B_panel (k x NR),
// in passes of kRowsPerPass rows whose accumulators (kRowsPerPass x NR / W
// vectors) stay in registers: 12 x 2 for AVX-512 (32 registers), 3 x 4 for
// AVX2 and 1 x 8 for SSE (16 registers each), B's vectors and a broadcast
// besides.
constexpr int kVectorsPerRow = static_cast<int>(kGemmNR / W);
constexpr int kRowsPerPass = W == 16 ? 12 : W == 8 ? 3 : 1;
static_assert(kGemmMR % kRowsPerPass == 0, "a tile is whole passes");

void gemm_tile(int64_t k, const float* a, const float* b, float* c, int64_t ldc, int64_t mr,
               int64_t nr, float alpha, bool add) {
  constexpr int MR = static_cast<int>(kGemmMR), NV = kVectorsPerRow, RP = kRowsPerPass;
  // C's rows are far apart (ldc): start fetching them while the loop runs.
  for (int64_t r = 0; r < mr; ++r) {
    __builtin_prefetch(c + r * ldc, 1);
    __builtin_prefetch(c + r * ldc + kGemmNR - 1, 1);
  }
  for (int r0 = 0; r0 < mr; r0 += RP) {
    vf acc[RP][NV];
#pragma GCC unroll 12
    for (int r = 0; r < RP; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
    for (int64_t p = 0; p < k; ++p) {
      vf bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = load(b + p * kGemmNR + v * W);
      const float* ap = a + p * MR + r0;
#pragma GCC unroll 12
      for (int r = 0; r < RP; ++r) {
        const vf ar = splat(ap[r]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
      }
    }
    // Every index below is a constant once unrolled: the accumulators stay
    // registers (an index computed at run time would put them in memory).
    float edge[kGemmNR];
#pragma GCC unroll 12
    for (int r = 0; r < RP; ++r) {
      if (r0 + r >= mr) break;
      float* cr = c + (r0 + r) * ldc;
      if (nr == kGemmNR) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) store(cr + v * W, add ? load(cr + v * W) + alpha * acc[r][v] : alpha * acc[r][v]);
        continue;
      }
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) store(edge + v * W, alpha * acc[r][v]);
      for (int64_t j = 0; j < nr; ++j) cr[j] = add ? cr[j] + edge[j] : edge[j];
    }
  }
}

}  // namespace

const Kernels kTable = {
    FAST_ISA_NAME, binary, binary_bf16, relu, threshold_backward, gelu, gelu_backward, sum, accumulate, scale,
    softmax, softmax_backward, layer_norm, layer_norm_backward, adamw, bf16_to_f32, f32_to_bf16,
    pack_transposed, gemm_tile,
};

}  // namespace FAST_CAT_(isa_, FAST_ISA)

const Kernels& FAST_CAT_(kernels_, FAST_ISA)() { return FAST_CAT_(isa_, FAST_ISA)::kTable; }

}  // namespace fast
