// fast — a max_device plugin built for speed, against the plugin ABI only.
//
// float32 and bfloat16 kernels for the ops a transformer's training step
// spends its time in: add/sub/mul/div with broadcasting, relu, gelu and their
// backwards, sum/mean over dims, softmax/log_softmax and their backwards,
// layer norm and embedding and their backwards, AdamW's fused update, and
// mm/addmm/bmm with a packed, blocked GEMM. Being .out kernels of
// structured ops, the elementwise ones also serve the functional and
// in-place variants.
//
// Speed comes from two places:
//   - vectors: the compute kernels (simd_kernels.cpp) are compiled for
//     AVX-512, AVX2+FMA and baseline x86-64; init picks the widest the CPU
//     has (MAX_DEVICE_FAST_ISA=avx512|avx2|baseline forces one, for tests);
//   - threads: work is split with the host's parallel_for (ABI 1.2), which
//     is PyTorch's intra-op pool, so torch.set_num_threads decides.
// bfloat16 is computed in float32 (converted in blocks) and rounded once.
//
// It declines (the CPU kernel runs) what it does not do well or at all:
// other dtypes, non-contiguous operands (except GEMM inputs, which are
// packed from any strides), reductions over dims that are not one
// contiguous block, softmax over a dim other than the last, and anything
// that does not match the shapes a kernel expects (PyTorch raises its own
// error then).
#include <max_device/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "simd.h"

namespace {

using maxdev::Call;
using maxdev::Declined;
using maxdev::Tensor;

// Elements per task below which splitting across threads costs more than it
// saves (a parallel_for dispatch is a few microseconds).
constexpr int64_t kGrain = 32768;
// bfloat16 is converted to float32 in blocks of this many elements.
constexpr int64_t kBlock = 1024;
// Row kernels write outputs of at least this many bytes with streaming
// stores (as simd_kernels.cpp's elementwise kernels do).
constexpr int64_t kStreamBytes = int64_t{4} << 20;
constexpr int kMaxDims = 16;

struct State {
  const fast::Kernels* k;
};

maxdev_status init(const maxdev_host_api* host, maxdev_host_context* ctx, void** state) {
  const char* forced = std::getenv("MAX_DEVICE_FAST_ISA");
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const fast::Kernels* k = has512 ? &fast::kernels_avx512() : has2 ? &fast::kernels_avx2()
                                                                   : &fast::kernels_baseline();
  if (forced != nullptr && *forced != '\0') {
    const std::string want = forced;
    if (want == "avx512" && has512) k = &fast::kernels_avx512();
    else if (want == "avx2" && has2) k = &fast::kernels_avx2();
    else if (want == "baseline") k = &fast::kernels_baseline();
    else
      return host->set_error(ctx, ("MAX_DEVICE_FAST_ISA=" + want +
                                   ": expected avx512, avx2 or baseline, one this CPU supports")
                                      .c_str());
  }
  State* s = new (std::nothrow) State{k};
  if (s == nullptr) return MAXDEV_ERROR;
  host->log(ctx, MAXDEV_LOG_DEBUG, (std::string("kernels: ") + k->isa).c_str());
  *state = s;
  return MAXDEV_OK;
}

void teardown(void* state) { delete static_cast<State*>(state); }

const fast::Kernels& K(const Call& call) { return *call.state<State>().k; }

// ---------------------------------------------------------------------------
// dtypes

enum class Dt { f32, bf16 };

bool dtype_of(const Tensor& t, Dt* out) {
  if (t.has_dtype(maxdev::kFloat32)) *out = Dt::f32;
  else if (t.has_dtype(maxdev::kBFloat16)) *out = Dt::bf16;
  else return false;
  return true;
}

bool is(const Tensor& t, Dt d) {
  Dt own;
  return dtype_of(t, &own) && own == d;
}

maxdev_dtype abi_dtype(Dt d) { return d == Dt::f32 ? maxdev::kFloat32 : maxdev::kBFloat16; }

float bf16_value(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A 0-dim CPU tensor (a wrapped Python number) as a float.
bool cpu_scalar(const Tensor& t, float* out) {
  if (!t.is_cpu() || t.ndim() != 0) return false;
  const void* p = t.data_ptr();
  const maxdev_dtype d = t.dtype();
  if (maxdev::same_dtype(d, maxdev::kFloat32)) *out = *static_cast<const float*>(p);
  else if (maxdev::same_dtype(d, maxdev::kFloat64)) *out = static_cast<float>(*static_cast<const double*>(p));
  else if (maxdev::same_dtype(d, maxdev::kInt64)) *out = static_cast<float>(*static_cast<const int64_t*>(p));
  else if (maxdev::same_dtype(d, maxdev::kInt32)) *out = static_cast<float>(*static_cast<const int32_t*>(p));
  else if (maxdev::same_dtype(d, maxdev::kBool)) *out = *static_cast<const bool*>(p) ? 1.f : 0.f;
  else if (maxdev::same_dtype(d, maxdev::kBFloat16)) *out = bf16_value(*static_cast<const uint16_t*>(p));
  else return false;
  return true;
}

// A device tensor of dtype d, row-major contiguous.
bool device_contiguous(const Tensor& t, Dt d) { return !t.is_cpu() && is(t, d) && t.is_contiguous(); }

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim() != b.ndim()) return false;
  for (int64_t i = 0; i < a.ndim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

std::vector<int64_t> shape_of(const Tensor& t) { return t.shape().vec(); }

bool same_shape(const Tensor& t, const std::vector<int64_t>& shape) {
  return t.shape().vec() == shape;
}

// An output the kernel writes: out= resized to `shape` if it differs (as
// PyTorch's kernels do), then contiguous and not partly overlapping the
// inputs, else declined.
Tensor writable_output(const Call& call, int index, const std::vector<int64_t>& shape, Dt d,
                       std::initializer_list<Tensor> inputs) {
  Tensor out = call.output(index);
  if (!is(out, d) || out.is_cpu()) throw Declined{};
  if (!same_shape(out, shape)) {
    if (out.numel() != 0) throw Declined{};  // the CPU kernel warns and resizes
    out = call.resize_output(index, shape);
  }
  if (!out.is_contiguous()) throw Declined{};
  for (const Tensor& in : inputs)
    if (maxdev_tensor_overlap(out.raw(), in.raw()) == MAXDEV_OVERLAP_PARTIAL) throw Declined{};
  return out;
}

// n elements of p from index `at` as float32: in place for float32, else
// converted into buf (bfloat16 is computed in float32, in blocks).
void load_f32(const fast::Kernels& k, const void* p, Dt d, int64_t at, int64_t n, float* buf,
              const float** view) {
  if (d == Dt::f32) {
    *view = static_cast<const float*>(p) + at;
  } else {
    k.bf16_to_f32(static_cast<const uint16_t*>(p) + at, buf, n);
    *view = buf;
  }
}

// ---------------------------------------------------------------------------
// add/sub/mul/div .out, with broadcasting.

struct Operand {
  const void* data = nullptr;  // device data, or null for a scalar
  float scalar = 0.f;
  int64_t strides[kMaxDims] = {};  // in elements over the output's dims (0: broadcast)
};

// Broadcast shape of a and b (PyTorch's rule); false if they do not broadcast.
bool broadcast(const Tensor& a, const Tensor& b, std::vector<int64_t>* shape) {
  const int64_t n = std::max(a.ndim(), b.ndim());
  shape->assign(static_cast<size_t>(n), 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t da = i - (n - a.ndim()), db = i - (n - b.ndim());
    const int64_t sa = da >= 0 ? a.size(da) : 1, sb = db >= 0 ? b.size(db) : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    (*shape)[static_cast<size_t>(i)] = sa == 1 ? sb : sa;
  }
  return true;
}

void operand_strides(const Tensor& t, const std::vector<int64_t>& shape, Operand* op) {
  const int64_t n = static_cast<int64_t>(shape.size()), lead = n - t.ndim();
  int64_t stride = 1;
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t ti = i - lead;
    const int64_t size = ti >= 0 ? t.size(ti) : 1;
    op->strides[i] = size == 1 ? 0 : stride;
    stride *= size;
  }
}

void binary_out(Call& call, fast::BinaryOp op, bool has_alpha) {
  const Tensor a = call.tensor(0), b = call.tensor(1);
  const float alpha = has_alpha ? static_cast<float>(call.real(2)) : 1.f;
  Dt d;
  if (!dtype_of(call.output(0), &d)) throw Declined{};
  Operand ops[2];
  const Tensor ins[2] = {a, b};
  bool any_device = false;
  for (int i = 0; i < 2; ++i) {
    if (ins[i].is_cpu()) {
      if (!cpu_scalar(ins[i], &ops[i].scalar)) throw Declined{};
      // As the CPU's bfloat16 kernels: mul and div keep a scalar divisor or
      // factor in float32 (their opmath special case); add, sub and a
      // scalar first operand take it rounded to bfloat16.
      const bool opmath_scalar = i == 1 && (op == fast::BinaryOp::kMul || op == fast::BinaryOp::kDiv);
      if (d == Dt::bf16 && !opmath_scalar) {
        uint16_t rounded;
        K(call).f32_to_bf16(&ops[i].scalar, &rounded, 1);
        ops[i].scalar = bf16_value(rounded);
      }
    } else {
      if (!device_contiguous(ins[i], d) || ins[i].ndim() > kMaxDims) throw Declined{};
      ops[i].data = ins[i].data_ptr();
      any_device = true;
    }
  }
  if (!any_device) throw Declined{};
  std::vector<int64_t> shape;
  const Tensor shape_a = ins[0].is_cpu() ? ins[1] : ins[0], shape_b = ins[1].is_cpu() ? ins[0] : ins[1];
  if (!broadcast(shape_a, shape_b, &shape) || shape.size() > static_cast<size_t>(kMaxDims))
    throw Declined{};
  const Tensor out = writable_output(call, 0, shape, d, {a, b});
  const int64_t numel = out.numel();
  if (numel == 0) return;
  for (int i = 0; i < 2; ++i)
    if (ops[i].data != nullptr) operand_strides(ins[i], shape, &ops[i]);

  // Collapse dims that are contiguous for both operands; the innermost run
  // has step 0 or 1 in each.
  int64_t dims[kMaxDims], st[2][kMaxDims];
  int nd = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    const bool merge = nd > 0 && [&] {
      for (int o = 0; o < 2; ++o)
        if (st[o][nd - 1] != ops[o].strides[i] * shape[i]) return false;
      return true;
    }();
    if (merge) {
      dims[nd - 1] *= shape[i];
      for (int o = 0; o < 2; ++o) st[o][nd - 1] = ops[o].strides[i];
    } else {
      dims[nd] = shape[i];
      for (int o = 0; o < 2; ++o) st[o][nd] = ops[o].strides[i];
      ++nd;
    }
  }
  if (nd == 0) {
    dims[0] = 1;
    st[0][0] = st[1][0] = 0;
    nd = 1;
  }
  const int64_t inner = dims[nd - 1];
  const int64_t step[2] = {ops[0].data ? st[0][nd - 1] : 0, ops[1].data ? st[1][nd - 1] : 0};
  const int64_t rows = numel / inner;
  const fast::Kernels& k = K(call);
  void* out_data = out.data_ptr();

  // Runs rows [r0, r1), elements [c0, c1) of each. An operand of step 0 (a
  // scalar, or broadcast along the row) passes as its float32 value.
  auto run = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off[2] = {0, 0}, rem = r;
      for (int dd = nd - 2; dd >= 0; --dd) {
        const int64_t idx = rem % dims[dd];
        rem /= dims[dd];
        off[0] += idx * st[0][dd];
        off[1] += idx * st[1][dd];
      }
      const size_t size = d == Dt::f32 ? 4 : 2;
      const char* p[2] = {nullptr, nullptr};
      float scalar[2] = {ops[0].scalar, ops[1].scalar};
      for (int o = 0; o < 2; ++o) {
        if (!ops[o].data) continue;
        const char* at = static_cast<const char*>(ops[o].data) + off[o] * size;
        if (step[o] != 0) p[o] = at + c0 * size;
        else scalar[o] = d == Dt::f32 ? *reinterpret_cast<const float*>(at) : bf16_value(*reinterpret_cast<const uint16_t*>(at));
      }
      const int64_t at = r * inner + c0, n = c1 - c0;
      if (d == Dt::f32) {
        k.binary(op, reinterpret_cast<const float*>(p[0]), scalar[0], reinterpret_cast<const float*>(p[1]), scalar[1],
                 alpha, static_cast<float*>(out_data) + at, n);
      } else {
        k.binary_bf16(op, reinterpret_cast<const uint16_t*>(p[0]), scalar[0], reinterpret_cast<const uint16_t*>(p[1]),
                      scalar[1], alpha, static_cast<uint16_t*>(out_data) + at, n);
      }
    }
  };
  if (rows == 1) {
    call.parallel_for(0, inner, kGrain, [&](int64_t c0, int64_t c1) { run(0, 1, c0, c1); });
  } else {
    call.parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner),
                      [&](int64_t r0, int64_t r1) { run(r0, r1, 0, inner); });
  }
}

void add_out(Call& call) { binary_out(call, fast::BinaryOp::kAdd, true); }
void sub_out(Call& call) { binary_out(call, fast::BinaryOp::kSub, true); }
void mul_out(Call& call) { binary_out(call, fast::BinaryOp::kMul, false); }
void div_out(Call& call) { binary_out(call, fast::BinaryOp::kDiv, false); }

// ---------------------------------------------------------------------------
// Pointwise ops over same-shaped contiguous tensors: f(k, inputs..., out, n)
// on float32 ranges.

template <int N, typename F>
void pointwise(const Call& call, const Tensor (&ins)[N], const Tensor& out, Dt d, F f) {
  const int64_t numel = out.numel();
  const fast::Kernels& k = K(call);
  call.parallel_for(0, numel, kGrain, [&](int64_t b, int64_t e) {
    if (d == Dt::f32) {
      const float* v[N];
      for (int i = 0; i < N; ++i) v[i] = static_cast<const float*>(ins[i].data_ptr()) + b;
      f(k, v, static_cast<float*>(out.data_ptr()) + b, e - b);
      return;
    }
    float buf[N + 1][kBlock];
    for (int64_t c = b; c < e; c += kBlock) {
      const int64_t n = std::min(kBlock, e - c);
      const float* v[N];
      for (int i = 0; i < N; ++i) load_f32(k, ins[i].data_ptr(), d, c, n, buf[i], &v[i]);
      f(k, v, buf[N], n);
      k.f32_to_bf16(buf[N], static_cast<uint16_t*>(out.data_ptr()) + c, n);
    }
  });
}

template <int N>
Dt pointwise_inputs(const Tensor (&ins)[N]) {
  Dt d;
  if (!dtype_of(ins[0], &d)) throw Declined{};
  for (const Tensor& t : ins)
    if (!device_contiguous(t, d) || !same_shape(t, ins[0])) throw Declined{};
  return d;
}

bool tanh_approximation(const Call& call, int i) {
  const std::string_view mode = call.string(i);
  if (mode == "tanh") return true;
  if (mode == "none") return false;
  throw Declined{};  // PyTorch raises its own error
}

void relu_into(const Call& call, const Tensor& self, const Tensor& out, Dt d) {
  const Tensor ins[1] = {self};
  pointwise(call, ins, out, d, [](const fast::Kernels& k, const float* const* v, float* o, int64_t n) {
    k.relu(v[0], o, n);
  });
}

void relu(Call& call) {
  const Tensor self = call.tensor(0);
  const Tensor ins[1] = {self};
  const Dt d = pointwise_inputs(ins);
  relu_into(call, self, call.alloc_output(0, abi_dtype(d), self.shape()), d);
}

void relu_(Call& call) {
  const Tensor self = call.tensor(0);
  const Tensor ins[1] = {self};
  relu_into(call, self, self, pointwise_inputs(ins));
}

void relu_out(Call& call) {
  const Tensor self = call.tensor(0);
  const Tensor ins[1] = {self};
  const Dt d = pointwise_inputs(ins);
  relu_into(call, self, writable_output(call, 0, shape_of(self), d, {self}), d);
}

void gelu_out(Call& call) {
  const Tensor self = call.tensor(0);
  const bool approx = tanh_approximation(call, 1);
  const Tensor ins[1] = {self};
  const Dt d = pointwise_inputs(ins);
  const Tensor out = writable_output(call, 0, shape_of(self), d, {self});
  pointwise(call, ins, out, d, [approx](const fast::Kernels& k, const float* const* v, float* o, int64_t n) {
    k.gelu(v[0], o, n, approx);
  });
}

void gelu_backward_out(Call& call) {
  const Tensor grad = call.tensor(0), self = call.tensor(1);
  const bool approx = tanh_approximation(call, 2);
  const Tensor ins[2] = {grad, self};
  const Dt d = pointwise_inputs(ins);
  const Tensor out = writable_output(call, 0, shape_of(self), d, {grad, self});
  pointwise(call, ins, out, d, [approx](const fast::Kernels& k, const float* const* v, float* o, int64_t n) {
    k.gelu_backward(v[0], v[1], o, n, approx);
  });
}

void threshold_backward_out(Call& call) {
  const Tensor grad = call.tensor(0), self = call.tensor(1);
  const float threshold = static_cast<float>(call.real(2));
  const Tensor ins[2] = {grad, self};
  const Dt d = pointwise_inputs(ins);
  const Tensor out = writable_output(call, 0, shape_of(self), d, {grad, self});
  pointwise(call, ins, out, d, [threshold](const fast::Kernels& k, const float* const* v, float* o, int64_t n) {
    k.threshold_backward(v[0], v[1], threshold, o, n);
  });
}

// ---------------------------------------------------------------------------
// sum / mean over dims: the reduced dims (size-1 dims aside) must be one
// contiguous block, so the input reads as [outer, reduced, inner].

void reduce_out(Call& call, bool mean) {
  const Tensor self = call.tensor(0);
  Dt d;
  if (!dtype_of(self, &d) || !device_contiguous(self, d) || self.ndim() > kMaxDims) throw Declined{};
  if (!call.is_none(3) && !maxdev::same_dtype(call.dtype(3), self.dtype())) throw Declined{};
  const bool keepdim = call.boolean(2);
  bool reduced[kMaxDims] = {};
  const int64_t nd = self.ndim();
  const auto dims = call.optional_int_list(1);
  if (!dims || dims->empty()) {
    for (int64_t i = 0; i < nd; ++i) reduced[i] = true;
  } else {
    for (int64_t dim : *dims) {
      const int64_t n = nd > 0 ? nd : 1;
      if (dim < -n || dim >= n) throw Declined{};  // PyTorch's IndexError
      const int64_t w = dim < 0 ? dim + n : dim;
      if (nd > 0 && reduced[w]) throw Declined{};  // repeated dim: PyTorch's error
      if (nd > 0) reduced[w] = true;
    }
  }
  if (self.numel() == 0) throw Declined{};
  int64_t outer = 1, red = 1, inner = 1;
  int phase = 0;  // 0: outer, 1: reduced, 2: inner
  std::vector<int64_t> out_shape;
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t s = self.size(i);
    if (reduced[i]) {
      if (keepdim) out_shape.push_back(1);
    } else {
      out_shape.push_back(s);
    }
    if (s == 1) continue;
    if (reduced[i]) {
      if (phase == 2) throw Declined{};
      phase = 1;
      red *= s;
    } else if (phase == 0) {
      outer *= s;
    } else {
      phase = 2;
      inner *= s;
    }
  }
  const Tensor out = writable_output(call, 0, out_shape, d, {self});
  const float factor = mean ? 1.f / static_cast<float>(red) : 1.f;
  const fast::Kernels& k = K(call);
  const void* in = self.data_ptr();
  void* op = out.data_ptr();
  auto store = [&](const float* v, int64_t at, int64_t n) {
    if (d == Dt::f32) std::memcpy(static_cast<float*>(op) + at, v, static_cast<size_t>(n) * 4);
    else k.f32_to_bf16(v, static_cast<uint16_t*>(op) + at, n);
  };
  if (inner == 1) {  // rows of `red` contiguous elements
    call.parallel_for(0, outer, std::max<int64_t>(1, kGrain / red), [&](int64_t b, int64_t e) {
      std::vector<float> buf(d == Dt::bf16 ? static_cast<size_t>(std::min(red, kBlock)) : 0);
      for (int64_t r = b; r < e; ++r) {
        float s = 0.f;
        if (d == Dt::f32) {
          s = k.sum(static_cast<const float*>(in) + r * red, red);
        } else {
          for (int64_t c = 0; c < red; c += kBlock) {
            const int64_t n = std::min(kBlock, red - c);
            const float* v;
            load_f32(k, in, d, r * red + c, n, buf.data(), &v);
            s += k.sum(v, n);
          }
        }
        s *= factor;
        store(&s, r, 1);
      }
    });
    return;
  }
  // acc[inner] += each reduced row; parallel over outer x inner blocks.
  const int64_t iblock = std::max<int64_t>(256, std::min(inner, kGrain / 4));
  const int64_t nblocks = (inner + iblock - 1) / iblock;
  call.parallel_for(0, outer * nblocks, std::max<int64_t>(1, kGrain / (red * iblock)), [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(iblock)), buf(static_cast<size_t>(iblock));
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblocks, c0 = (t % nblocks) * iblock, n = std::min(iblock, inner - c0);
      std::fill(acc.begin(), acc.begin() + n, 0.f);
      for (int64_t r = 0; r < red; ++r) {
        const float* v;
        load_f32(k, in, d, (o * red + r) * inner + c0, n, buf.data(), &v);
        k.accumulate(acc.data(), v, n);
      }
      if (mean) k.scale(acc.data(), factor, n);
      store(acc.data(), o * inner + c0, n);
    }
  });
}

void sum_out(Call& call) { reduce_out(call, false); }
void mean_out(Call& call) { reduce_out(call, true); }

// ---------------------------------------------------------------------------
// Row kernels over the last dim: the softmax family.

// Whether `dim` is t's last dimension (a 0-dim tensor has one row of one).
bool last_dim(const Tensor& t, int64_t dim) {
  const int64_t n = t.ndim() > 0 ? t.ndim() : 1;
  if (dim < -n || dim >= n) return false;
  return (dim < 0 ? dim + n : dim) == n - 1;
}

// Whether a row kernel streams `out` (bfloat16 rows are written by the
// conversion from a float32 row, never streamed).
bool streamed(const Tensor& out, Dt d) { return d == Dt::f32 && out.numel() * 4 >= kStreamBytes; }

// Runs f(kernels, float* rows_in[N], float* row_out, n, stream, scratch)
// for each row of `cols` elements, converting bfloat16 rows; `scratch` is a
// row of the thread's own while the output is streamed, else null.
template <int N, typename F>
void for_rows(const Call& call, const Tensor (&ins)[N], const Tensor& out, Dt d, int64_t cols, F f) {
  const int64_t rows = cols == 0 ? 0 : out.numel() / cols;
  const bool stream = streamed(out, d);
  const fast::Kernels& k = K(call);
  call.parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
    // bfloat16: N input rows and the output row in float32; streaming: scratch
    const int64_t converted = d == Dt::bf16 ? N + 1 : 0;
    std::vector<float> buf(static_cast<size_t>((converted + (stream ? 1 : 0)) * cols));
    float* scratch = stream ? buf.data() + converted * cols : nullptr;
    for (int64_t r = b; r < e; ++r) {
      const float* v[N];
      for (int i = 0; i < N; ++i) load_f32(k, ins[i].data_ptr(), d, r * cols, cols, buf.data() + i * cols, &v[i]);
      float* o = d == Dt::f32 ? static_cast<float*>(out.data_ptr()) + r * cols : buf.data() + N * cols;
      f(k, v, o, cols, stream, scratch);
      if (d == Dt::bf16) k.f32_to_bf16(o, static_cast<uint16_t*>(out.data_ptr()) + r * cols, cols);
    }
  });
}

void softmax_out_impl(Call& call, bool log) {
  const Tensor self = call.tensor(0);
  if (call.boolean(2) || !last_dim(self, call.integer(1))) throw Declined{};
  const Tensor ins[1] = {self};
  const Dt d = pointwise_inputs(ins);
  // The CPU's bfloat16 log_softmax rounds every intermediate (x - max, each
  // exp, the running sum, its log) to bfloat16; computed in float32 the
  // results differ in the last bits, so leave it to the CPU.
  if (log && d == Dt::bf16) throw Declined{};
  const Tensor out = writable_output(call, 0, shape_of(self), d, {self});
  const int64_t cols = self.ndim() > 0 ? self.size(-1) : 1;
  for_rows(call, ins, out, d, cols,
           [log](const fast::Kernels& k, const float* const* v, float* o, int64_t n, bool stream, float* scratch) {
             k.softmax(v[0], o, n, log, scratch, stream);
           });
}

void softmax_out(Call& call) { softmax_out_impl(call, false); }
void log_softmax_out(Call& call) { softmax_out_impl(call, true); }

void softmax_backward_impl(Call& call, bool log) {
  const Tensor grad = call.tensor(0), output = call.tensor(1);
  if (!last_dim(grad, call.integer(2)) || !maxdev::same_dtype(call.dtype(3), grad.dtype())) throw Declined{};
  const Tensor ins[2] = {grad, output};
  const Dt d = pointwise_inputs(ins);
  const Tensor out = writable_output(call, 0, shape_of(grad), d, {grad, output});
  const int64_t cols = grad.ndim() > 0 ? grad.size(-1) : 1;
  for_rows(call, ins, out, d, cols,
           [log](const fast::Kernels& k, const float* const* v, float* o, int64_t n, bool stream, float*) {
             k.softmax_backward(v[0], v[1], o, n, log, stream);
           });
}

void softmax_backward_out(Call& call) { softmax_backward_impl(call, false); }
void log_softmax_backward_out(Call& call) { softmax_backward_impl(call, true); }

// ---------------------------------------------------------------------------
// Layer norm over the trailing dims `normalized_shape`: rows of N elements.

// N (the product of normalized_shape) when it names input's trailing dims
// and weight/bias (if set) are contiguous device tensors of that shape and
// dtype d; else declined (PyTorch raises its own error for a mismatch).
int64_t layer_norm_row_size(const Tensor& input, maxdev::ArrayView<int64_t> normalized, Dt d,
                            std::initializer_list<std::optional<Tensor>> params) {
  const int64_t axis = input.ndim() - static_cast<int64_t>(normalized.size());
  if (normalized.size() == 0 || axis < 0) throw Declined{};
  int64_t n = 1;
  for (size_t i = 0; i < normalized.size(); ++i) {
    if (input.size(axis + static_cast<int64_t>(i)) != normalized[i]) throw Declined{};
    n *= normalized[i];
  }
  for (const auto& p : params)
    if (p && (!device_contiguous(*p, d) || p->numel() != n)) throw Declined{};
  if (n == 0 || input.numel() == 0) throw Declined{};
  return n;
}

// The shape of layer norm's mean and rstd: input's leading dims, then 1s.
std::vector<int64_t> layer_norm_stat_shape(const Tensor& input, size_t normalized_dims) {
  std::vector<int64_t> shape = shape_of(input);
  for (size_t i = shape.size() - normalized_dims; i < shape.size(); ++i) shape[i] = 1;
  return shape;
}

// A float32 view of parameter p (weight/bias) or null; bfloat16 is
// converted into buf.
const float* param_f32(const fast::Kernels& k, const std::optional<Tensor>& p, Dt d, std::vector<float>& buf) {
  if (!p) return nullptr;
  const float* view;
  if (d == Dt::bf16) buf.resize(static_cast<size_t>(p->numel()));
  load_f32(k, p->data_ptr(), d, 0, p->numel(), buf.data(), &view);
  return view;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
void native_layer_norm(Call& call) {
  const Tensor input = call.tensor(0);
  const auto normalized = call.int_list(1);
  const auto weight = call.optional_tensor(2), bias = call.optional_tensor(3);
  const float eps = static_cast<float>(call.real(4));
  Dt d;
  if (!dtype_of(input, &d) || !device_contiguous(input, d)) throw Declined{};
  const int64_t n = layer_norm_row_size(input, normalized, d, {weight, bias});
  const int64_t rows = input.numel() / n;
  const maxdev_dtype dt = abi_dtype(d);
  const Tensor out = call.alloc_output(0, dt, input.shape());
  const std::vector<int64_t> stat_shape = layer_norm_stat_shape(input, normalized.size());
  const Tensor mean = call.alloc_output(1, dt, stat_shape), rstd = call.alloc_output(2, dt, stat_shape);
  const fast::Kernels& k = K(call);
  std::vector<float> wbuf, bbuf;
  const float* w = param_f32(k, weight, d, wbuf);
  const float* b = param_f32(k, bias, d, bbuf);
  const bool stream = streamed(out, d);
  call.parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(d == Dt::bf16 ? static_cast<size_t>(2 * n) : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x;
      load_f32(k, input.data_ptr(), d, r * n, n, buf.data(), &x);
      float* y = d == Dt::f32 ? static_cast<float*>(out.data_ptr()) + r * n : buf.data() + n;
      float m, s;
      k.layer_norm(x, w, b, eps, y, n, &m, &s, stream);
      if (d == Dt::f32) {
        static_cast<float*>(mean.data_ptr())[r] = m;
        static_cast<float*>(rstd.data_ptr())[r] = s;
      } else {
        k.f32_to_bf16(y, static_cast<uint16_t*>(out.data_ptr()) + r * n, n);
        k.f32_to_bf16(&m, static_cast<uint16_t*>(mean.data_ptr()) + r, 1);
        k.f32_to_bf16(&s, static_cast<uint16_t*>(rstd.data_ptr()) + r, 1);
      }
    }
  });
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight?, bias?, bool[3] output_mask) -> (grad_input, grad_weight, grad_bias).
// Every output must be allocated, so only an all-true mask (with weight and
// bias) is served; the others are declined.
void native_layer_norm_backward(Call& call) {
  const Tensor grad = call.tensor(0), input = call.tensor(1);
  const auto normalized = call.int_list(2);
  const Tensor mean = call.tensor(3), rstd = call.tensor(4);
  const auto weight = call.optional_tensor(5), bias = call.optional_tensor(6);
  const auto mask = call.bool_list(7);
  if (mask.size() != 3 || !mask[0] || !mask[1] || !mask[2] || !weight || !bias) throw Declined{};
  Dt d;
  if (!dtype_of(input, &d) || !device_contiguous(input, d) || !device_contiguous(grad, d) ||
      !same_shape(grad, input) || !device_contiguous(mean, d) || !device_contiguous(rstd, d))
    throw Declined{};
  const int64_t n = layer_norm_row_size(input, normalized, d, {weight, bias});
  const int64_t rows = input.numel() / n;
  if (mean.numel() != rows || rstd.numel() != rows) throw Declined{};
  const maxdev_dtype dt = abi_dtype(d);
  const Tensor dx = call.alloc_output(0, dt, input.shape());
  const Tensor dw = call.alloc_output(1, dt, weight->shape()), db = call.alloc_output(2, dt, bias->shape());
  const fast::Kernels& k = K(call);
  std::vector<float> wbuf;
  const float* w = param_f32(k, weight, d, wbuf);
  // dw and db sum over rows: each of a fixed number of row chunks sums into
  // its own partials, added in chunk order, so results do not depend on the
  // thread count.
  const int64_t chunks = std::min<int64_t>(rows, 32), chunk_rows = (rows + chunks - 1) / chunks;
  const bool stream = streamed(dx, d);
  std::vector<float> partial(static_cast<size_t>(2 * chunks * n), 0.f);
  call.parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> buf(d == Dt::bf16 ? static_cast<size_t>(3 * n) : 0);
    for (int64_t c = c0; c < c1; ++c) {
      float* pw = partial.data() + 2 * c * n;
      for (int64_t r = c * chunk_rows; r < std::min(rows, (c + 1) * chunk_rows); ++r) {
        const float *dy, *x;
        load_f32(k, grad.data_ptr(), d, r * n, n, buf.data(), &dy);
        load_f32(k, input.data_ptr(), d, r * n, n, buf.data() + n, &x);
        float m, s;
        if (d == Dt::f32) {
          m = static_cast<const float*>(mean.data_ptr())[r];
          s = static_cast<const float*>(rstd.data_ptr())[r];
        } else {
          m = bf16_value(static_cast<const uint16_t*>(mean.data_ptr())[r]);
          s = bf16_value(static_cast<const uint16_t*>(rstd.data_ptr())[r]);
        }
        float* out = d == Dt::f32 ? static_cast<float*>(dx.data_ptr()) + r * n : buf.data() + 2 * n;
        k.layer_norm_backward(dy, x, m, s, w, out, pw, pw + n, n, stream);
        if (d == Dt::bf16) k.f32_to_bf16(out, static_cast<uint16_t*>(dx.data_ptr()) + r * n, n);
      }
    }
  });
  for (int64_t c = 1; c < chunks; ++c) k.accumulate(partial.data(), partial.data() + 2 * c * n, 2 * n);
  if (n == 0) return;  // empty outputs have null data pointers
  if (d == Dt::f32) {
    std::memcpy(dw.data_ptr(), partial.data(), static_cast<size_t>(n) * 4);
    std::memcpy(db.data_ptr(), partial.data() + n, static_cast<size_t>(n) * 4);
  } else {
    k.f32_to_bf16(partial.data(), static_cast<uint16_t*>(dw.data_ptr()), n);
    k.f32_to_bf16(partial.data() + n, static_cast<uint16_t*>(db.data_ptr()), n);
  }
}

// ---------------------------------------------------------------------------
// Embedding: rows of a [num, dim] table gathered by int64/int32 indices, and
// the gradient scattered back.

// The indices as int64 values, or declined for another dtype, a
// non-contiguous tensor or an index outside [0, num) (PyTorch's IndexError).
std::vector<int64_t> embedding_indices(const Tensor& indices, int64_t num) {
  if (indices.is_cpu() || !indices.is_contiguous()) throw Declined{};
  const int64_t count = indices.numel();
  std::vector<int64_t> out(static_cast<size_t>(count));
  if (indices.has_dtype(maxdev::kInt64)) {
    if (count > 0) std::memcpy(out.data(), indices.data_ptr(), static_cast<size_t>(count) * 8);  // empty: null pointers
  } else if (indices.has_dtype(maxdev::kInt32)) {
    const int32_t* p = static_cast<const int32_t*>(indices.data_ptr());
    for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = p[i];
  } else {
    throw Declined{};
  }
  for (int64_t v : out)
    if (v < 0 || v >= num) throw Declined{};
  return out;
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) -> weight[indices]
void embedding(Call& call) {
  const Tensor weight = call.tensor(0), indices = call.tensor(1);
  Dt d;
  if (!dtype_of(weight, &d) || !device_contiguous(weight, d) || weight.ndim() != 2) throw Declined{};
  const int64_t dim = weight.size(1);
  const std::vector<int64_t> idx = embedding_indices(indices, weight.size(0));
  std::vector<int64_t> shape = shape_of(indices);
  shape.push_back(dim);
  const Tensor out = call.alloc_output(0, abi_dtype(d), shape);
  const size_t row_bytes = static_cast<size_t>(dim) * (d == Dt::f32 ? 4 : 2);
  if (row_bytes == 0 || idx.empty()) return;  // empty tensors have null data pointers
  const char* src = static_cast<const char*>(weight.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  call.parallel_for(0, static_cast<int64_t>(idx.size()), std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i)
                        std::memcpy(dst + i * row_bytes, src + idx[static_cast<size_t>(i)] * row_bytes, row_bytes);
                    });
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq) -> grad_weight. Each task owns a range of weight rows
// and adds the gradients of their indices in index order, so results do not
// depend on the thread count. scale_grad_by_freq is declined.
void embedding_dense_backward(Call& call) {
  const Tensor grad = call.tensor(0), indices = call.tensor(1);
  const int64_t num = call.integer(2), padding_idx = call.integer(3);
  if (call.boolean(4) || num < 0) throw Declined{};
  Dt d;
  if (!dtype_of(grad, &d) || !device_contiguous(grad, d) || grad.ndim() != indices.ndim() + 1) throw Declined{};
  for (int64_t i = 0; i < indices.ndim(); ++i)
    if (grad.size(i) != indices.size(i)) throw Declined{};
  const int64_t dim = grad.size(-1);
  const std::vector<int64_t> idx = embedding_indices(indices, num);
  const Tensor out = call.alloc_output(0, abi_dtype(d), {num, dim});
  const fast::Kernels& k = K(call);
  const int64_t count = static_cast<int64_t>(idx.size());
  call.parallel_for(0, num, std::max<int64_t>(1, kGrain / std::max<int64_t>(count * dim / std::max<int64_t>(num, 1), 1)),
                    [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(static_cast<size_t>((r1 - r0) * dim), 0.f), buf(d == Dt::bf16 ? static_cast<size_t>(dim) : 0);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = idx[static_cast<size_t>(i)];
      if (r < r0 || r >= r1 || r == padding_idx) continue;
      const float* g;
      load_f32(k, grad.data_ptr(), d, i * dim, dim, buf.data(), &g);
      k.accumulate(acc.data() + (r - r0) * dim, g, dim);
    }
    if (acc.empty()) return;  // empty tensors have null data pointers
    if (d == Dt::f32) std::memcpy(static_cast<float*>(out.data_ptr()) + r0 * dim, acc.data(), acc.size() * 4);
    else k.f32_to_bf16(acc.data(), static_cast<uint16_t*>(out.data_ptr()) + r0 * dim, static_cast<int64_t>(acc.size()));
  });
}

// ---------------------------------------------------------------------------
// AdamW: _fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
// state_steps, *, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
// grad_scale?, found_inf?), what torch.optim.AdamW(fused=True) calls once
// per step for all parameters. amsgrad and gradient scaling are declined.

void fused_adamw(Call& call) {
  const std::vector<Tensor> params = call.tensor_list(0), grads = call.tensor_list(1),
                            exp_avgs = call.tensor_list(2), exp_avg_sqs = call.tensor_list(3),
                            steps = call.tensor_list(5);
  const double lr = call.real(6), beta1 = call.real(7), beta2 = call.real(8), weight_decay = call.real(9);
  const float eps = static_cast<float>(call.real(10));
  if (call.boolean(11) || !call.is_none(13) || !call.is_none(14)) throw Declined{};
  const size_t count = params.size();
  if (grads.size() != count || exp_avgs.size() != count || exp_avg_sqs.size() != count || steps.size() != count)
    throw Declined{};
  if (count == 0) return;
  Dt d;
  if (!dtype_of(params[0], &d)) throw Declined{};
  // Constants per tensor (its own step), and where each starts in the
  // concatenation of all, which the threads split evenly.
  std::vector<fast::AdamWStep> consts(count);
  std::vector<int64_t> start(count + 1, 0);
  for (size_t t = 0; t < count; ++t) {
    for (const Tensor* x : {&params[t], &grads[t], &exp_avgs[t], &exp_avg_sqs[t]})
      if (!device_contiguous(*x, d) || !same_shape(*x, params[t])) throw Declined{};
    if (steps[t].numel() != 1 || !steps[t].has_dtype(maxdev::kFloat32)) throw Declined{};
    const double step = *static_cast<const float*>(steps[t].data_ptr());
    const double bias_correction1 = 1 - std::pow(beta1, step), bias_correction2 = 1 - std::pow(beta2, step);
    consts[t] = {static_cast<float>(1 - lr * weight_decay), static_cast<float>(1 - beta1), static_cast<float>(beta2),
                 static_cast<float>(1 - beta2), static_cast<float>(lr / bias_correction1),
                 static_cast<float>(1 / std::sqrt(bias_correction2)), eps, call.boolean(12)};
    start[t + 1] = start[t] + params[t].numel();
  }
  const fast::Kernels& k = K(call);
  call.parallel_for(0, start[count], kGrain, [&](int64_t b, int64_t e) {
    size_t t = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    float buf[4][kBlock];
    for (; t < count && start[t] < e; ++t) {
      const int64_t lo = std::max(b, start[t]) - start[t], hi = std::min(e, start[t + 1]) - start[t];
      void* p = params[t].data_ptr();
      const void* g = grads[t].data_ptr();
      void* m = exp_avgs[t].data_ptr();
      void* v = exp_avg_sqs[t].data_ptr();
      if (d == Dt::f32) {
        k.adamw(static_cast<float*>(p) + lo, static_cast<const float*>(g) + lo, static_cast<float*>(m) + lo,
                static_cast<float*>(v) + lo, hi - lo, consts[t]);
        continue;
      }
      for (int64_t c = lo; c < hi; c += kBlock) {
        const int64_t n = std::min(kBlock, hi - c);
        void* io[4] = {p, const_cast<void*>(g), m, v};
        for (int i = 0; i < 4; ++i) k.bf16_to_f32(static_cast<const uint16_t*>(io[i]) + c, buf[i], n);
        k.adamw(buf[0], buf[1], buf[2], buf[3], n, consts[t]);
        for (int i : {0, 2, 3}) k.f32_to_bf16(buf[i], static_cast<uint16_t*>(io[i]) + c, n);
      }
    }
  });
}

// ---------------------------------------------------------------------------
// GEMM (float32): C[b] (+)= alpha * A[b] @ B[b] with A, B of any strides
// (packed into panels), C contiguous. Tasks are (batch, row block, column
// block) blocks of C, at most 192 x 512, near-equal, and enough for every thread.

struct Matrix {
  const float* data;
  int64_t sb, sr, sc;  // batch, row, column strides in elements
  float at(int64_t b, int64_t r, int64_t c) const { return data[b * sb + r * sr + c * sc]; }
};

constexpr int64_t kGemmMC = 16 * fast::kGemmMR;
constexpr int64_t kGemmNC = 16 * fast::kGemmNR;

// `rows` lines of a block (line r, element p at src[r * line_stride + p *
// k_stride]) as k-major panels of `width` lines, zero-padded: B's columns
// as panels of kGemmNR, A's rows as panels of kGemmMR. Reads along
// whichever dimension is contiguous.
void pack_panels(const fast::Kernels& k, const float* src, int64_t line_stride, int64_t k_stride, int64_t lines,
                 int64_t kc, int64_t width, float* out) {
  for (int64_t l0 = 0; l0 < lines; l0 += width) {
    const int64_t n = std::min(width, lines - l0);
    float* panel = out + l0 * kc;
    const float* block = src + l0 * line_stride;
    if (k_stride == 1 && line_stride != 1) {  // lines are rows of memory: transposed in registers
      k.pack_transposed(block, line_stride, n, kc, width, panel);
      continue;
    }
    for (int64_t p = 0; p < kc; ++p) {
      if (line_stride == 1) {
        std::memcpy(panel + p * width, block + p * k_stride, static_cast<size_t>(n) * 4);
      } else {
        for (int64_t j = 0; j < n; ++j) panel[p * width + j] = block[j * line_stride + p * k_stride];
      }
      std::fill(panel + p * width + n, panel + (p + 1) * width, 0.f);
    }
  }
}

// B[k0 : k0+kc, n0 : n0+nc] as panels of kGemmNR columns.
void pack_b(const fast::Kernels& k, const Matrix& B, int64_t b, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
            float* out) {
  pack_panels(k, B.data + b * B.sb + k0 * B.sr + n0 * B.sc, B.sc, B.sr, nc, kc, fast::kGemmNR, out);
}

// A[m0 : m0+mc, k0 : k0+kc] as panels of kGemmMR rows.
void pack_a(const fast::Kernels& k, const Matrix& A, int64_t b, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
            float* out) {
  pack_panels(k, A.data + b * A.sb + m0 * A.sr + k0 * A.sc, A.sr, A.sc, mc, kc, fast::kGemmMR, out);
}

// Splits `extent` rows (or columns) into at most `blocks` near-equal
// blocks, each a whole number of `unit`s (a register tile) except the last:
// equal tasks keep every thread busy to the end (1024 rows as 192-row
// blocks left one thread 12% more work than the other).
struct Blocking {
  int64_t blocks, size;
  Blocking(int64_t extent, int64_t max_blocks, int64_t unit) {
    const int64_t units = (extent + unit - 1) / unit;
    size = (units + max_blocks - 1) / max_blocks * unit;
    blocks = std::max<int64_t>(1, (extent + size - 1) / size);
  }
};

int64_t blocks_of(int64_t extent, int64_t max_size) { return std::max<int64_t>(1, (extent + max_size - 1) / max_size); }

struct GemmBlocks {
  Blocking m, n;
};

// Blocks of C no larger than the caches allow, split further until the
// tasks divide among the threads within an eighth (parallel_for gives each
// thread ceil(tasks / threads) of them: a 64 x 192 product was one task, on
// one of two threads; 512 x 256 was three). A split repacks the other
// operand once per block, so the dimension whose other operand is smaller
// is split: N (A repacked) when M <= N, else M (B repacked).
GemmBlocks gemm_blocks(int64_t batch, int64_t M, int64_t N, int threads) {
  constexpr int64_t MR = fast::kGemmMR, NR = fast::kGemmNR;
  int64_t mb = blocks_of(M, kGemmMC), nb = blocks_of(N, kGemmNC);
  GemmBlocks g{Blocking(M, mb, MR), Blocking(N, nb, NR)};
  const int64_t m_units = blocks_of(M, MR), n_units = blocks_of(N, NR);
  for (;;) {
    const int64_t tasks = batch * g.m.blocks * g.n.blocks;
    const int64_t per_thread = (tasks + threads - 1) / threads;
    if (per_thread * threads * 8 <= tasks * 9) return g;
    const bool split_n = n_units > g.n.blocks && (M <= N || m_units <= g.m.blocks);
    if (split_n) {
      while (Blocking(N, ++nb, NR).blocks == g.n.blocks) {}
      g.n = Blocking(N, nb, NR);
    } else if (m_units > g.m.blocks) {
      while (Blocking(M, ++mb, MR).blocks == g.m.blocks) {}
      g.m = Blocking(M, mb, MR);
    } else {
      return g;  // one register tile per task: nothing left to split
    }
  }
}

// GotoBLAS's loop order. Tasks run with the row block varying fastest, so
// a thread's range of tasks is runs of blocks sharing one column block:
// per K slice, a run packs its B block (kc x nc) once, then each task's A
// block (mc x kc, kept in L2), and each B panel (kc x NR) stays in L1 while
// every A panel of the block passes it.
void gemm(const Call& call, int64_t batch, int64_t M, int64_t N, int64_t Kd, const Matrix& A,
          const Matrix& B, float* C, float alpha, bool add) {
  if (Kd == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (!add) std::fill(C, C + batch * M * N, 0.f);
    return;
  }
  const fast::Kernels& k = K(call);
  const auto [mblock, nblock] = gemm_blocks(batch, M, N, call.num_threads());
  // Panels sized to this product, not to the largest block, and left
  // uninitialized (packing writes every element read): a small GEMM (an
  // attention head's bmm) must not pay for zeroing or mapping 350 KiB.
  const int64_t round_nr = (std::min(N, nblock.size) + fast::kGemmNR - 1) / fast::kGemmNR * fast::kGemmNR;
  const int64_t round_mr = (std::min(M, mblock.size) + fast::kGemmMR - 1) / fast::kGemmMR * fast::kGemmMR;
  const size_t kc_max = static_cast<size_t>(std::min(Kd, fast::kGemmKC));
  call.parallel_for(0, batch * nblock.blocks * mblock.blocks, 1, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<float[]> bpack(new float[kc_max * static_cast<size_t>(round_nr)]);
    std::unique_ptr<float[]> apack(new float[kc_max * static_cast<size_t>(round_mr)]);
    for (int64_t run = t0; run < t1;) {
      const int64_t bn = run / mblock.blocks, b = bn / nblock.blocks;
      const int64_t run_end = std::min(t1, (bn + 1) * mblock.blocks);
      const int64_t n0 = (bn % nblock.blocks) * nblock.size, nc = std::min(nblock.size, N - n0);
      float* Cb = C + b * M * N;
      for (int64_t k0 = 0; k0 < Kd; k0 += fast::kGemmKC) {
        const int64_t kc = std::min(fast::kGemmKC, Kd - k0);
        pack_b(k, B, b, k0, kc, n0, nc, bpack.get());
        for (int64_t t = run; t < run_end; ++t) {
          const int64_t m0 = (t % mblock.blocks) * mblock.size, mc = std::min(mblock.size, M - m0);
          pack_a(k, A, b, m0, mc, k0, kc, apack.get());
          for (int64_t j0 = 0; j0 < nc; j0 += fast::kGemmNR) {
            for (int64_t i0 = 0; i0 < mc; i0 += fast::kGemmMR) {
              k.gemm_tile(kc, apack.get() + i0 * kc, bpack.get() + j0 * kc, Cb + (m0 + i0) * N + n0 + j0, N,
                          std::min(fast::kGemmMR, mc - i0), std::min(fast::kGemmNR, nc - j0), alpha,
                          add || k0 > 0);
            }
          }
        }
      }
      run = run_end;
    }
  });
}

Matrix matrix(const Tensor& t) {
  const float* data = static_cast<const float*>(t.data_ptr());
  if (t.ndim() == 2) return {data, 0, t.stride(0), t.stride(1)};
  return {data, t.stride(0), t.stride(1), t.stride(2)};
}

float* f32_data(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

bool gemm_operand(const Tensor& t, Dt d, int64_t ndim) { return !t.is_cpu() && is(t, d) && t.ndim() == ndim; }

// bfloat16 GEMMs are left to the CPU: its oneDNN kernels use the AMX/VNNI
// bfloat16 units (measured 13x faster than this float32 GEMM at 1024^3).
bool gemm_dtype(const Tensor& t, Dt* d) { return dtype_of(t, d) && *d == Dt::f32; }

// Products of fewer multiply-adds per matrix than this, or narrower than one
// register tile, are left to the CPU: packing and edge tiles dominate them
// (an attention head's 32x32x16 bmm measured 2.3-4.8x the CPU's time).
constexpr int64_t kGemmMinMacs = 1 << 17;
bool small_gemm(int64_t M, int64_t N, int64_t K) { return N < fast::kGemmNR || M * N * K < kGemmMinMacs; }

void mm_out(Call& call) {
  const Tensor a = call.tensor(0), b = call.tensor(1);
  Dt d;
  if (!gemm_dtype(a, &d) || !gemm_operand(a, d, 2) || !gemm_operand(b, d, 2) || a.size(1) != b.size(0) ||
      small_gemm(a.size(0), b.size(1), a.size(1)))
    throw Declined{};
  const Tensor out = writable_output(call, 0, {a.size(0), b.size(1)}, d, {a, b});
  if (out.numel() == 0) return;
  gemm(call, 1, a.size(0), b.size(1), a.size(1), matrix(a), matrix(b), f32_data(out), 1.f, false);
}

void bmm_out(Call& call) {
  const Tensor a = call.tensor(0), b = call.tensor(1);
  Dt d;
  if (!gemm_dtype(a, &d) || !gemm_operand(a, d, 3) || !gemm_operand(b, d, 3) || a.size(0) != b.size(0) ||
      a.size(2) != b.size(1) || small_gemm(a.size(1), b.size(2), a.size(2)))
    throw Declined{};
  const Tensor out = writable_output(call, 0, {a.size(0), a.size(1), b.size(2)}, d, {a, b});
  if (out.numel() == 0) return;
  gemm(call, a.size(0), a.size(1), b.size(2), a.size(2), matrix(a), matrix(b), f32_data(out), 1.f,
       false);
}

// addmm.out(self, mat1, mat2, *, beta, alpha, out) = beta * self + alpha * mat1 @ mat2
void addmm_out(Call& call) {
  const Tensor self = call.tensor(0), a = call.tensor(1), b = call.tensor(2);
  const float beta = static_cast<float>(call.real(3)), alpha = static_cast<float>(call.real(4));
  Dt d;
  if (!gemm_dtype(a, &d) || !gemm_operand(a, d, 2) || !gemm_operand(b, d, 2) || a.size(1) != b.size(0) ||
      self.is_cpu() || !is(self, d) || self.ndim() > 2 || small_gemm(a.size(0), b.size(1), a.size(1)))
    throw Declined{};
  const int64_t M = a.size(0), N = b.size(1);
  // self broadcasts to [M, N]
  int64_t s_r = 0, s_c = 0;
  if (self.ndim() == 2) {
    if ((self.size(0) != M && self.size(0) != 1) || (self.size(1) != N && self.size(1) != 1)) throw Declined{};
    s_r = self.size(0) == 1 ? 0 : self.stride(0);
    s_c = self.size(1) == 1 ? 0 : self.stride(1);
  } else if (self.ndim() == 1) {
    if (self.size(0) != N && self.size(0) != 1) throw Declined{};
    s_c = self.size(0) == 1 ? 0 : self.stride(0);
  }
  const Tensor out = writable_output(call, 0, {M, N}, d, {self, a, b});
  if (out.numel() == 0) return;
  const Matrix bias{static_cast<const float*>(self.data_ptr()), 0, s_r, s_c};
  float* c = f32_data(out);
  const bool add = beta != 0.f;  // beta == 0: self is ignored (NaN included), as in PyTorch
  if (add) {
    // When out is self (addmm_), each element is read before it is written.
    call.parallel_for(0, M, std::max<int64_t>(1, kGrain / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < N; ++j) c[r * N + j] = beta * bias.at(0, r, j);
    });
  }
  gemm(call, 1, M, N, a.size(1), matrix(a), matrix(b), c, alpha, add);
}

}  // namespace

#define F32 MAXDEV_DTYPE_FLOAT32
#define BF16 MAXDEV_DTYPE_BFLOAT16
#define FLOATS (F32 | BF16)
#define INDICES (MAXDEV_DTYPE_INT64 | MAXDEV_DTYPE_INT32)
#define CONTIG MAXDEV_KERNEL_CONTIGUOUS_ONLY
#define NOCPU MAXDEV_KERNEL_NO_CPU_TENSORS

#define FAST_KERNELS(K)                                                                        \
  K("aten::add.out", "", MAXDEV_SDK_KERNEL(add_out), 0, 0)                                     \
  K("aten::sub.out", "", MAXDEV_SDK_KERNEL(sub_out), 0, 0)                                     \
  K("aten::mul.out", "", MAXDEV_SDK_KERNEL(mul_out), 0, 0)                                     \
  K("aten::div.out", "", MAXDEV_SDK_KERNEL(div_out), 0, 0)                                     \
  K("aten::relu", "", MAXDEV_SDK_KERNEL(relu), FLOATS, CONTIG | NOCPU)                         \
  K("aten::relu_", "", MAXDEV_SDK_KERNEL(relu_), FLOATS, CONTIG | NOCPU)                       \
  K("aten::relu.out", "", MAXDEV_SDK_KERNEL(relu_out), FLOATS, NOCPU)                          \
  K("aten::threshold_backward.grad_input", "", MAXDEV_SDK_KERNEL(threshold_backward_out), FLOATS, NOCPU) \
  K("aten::gelu.out", "", MAXDEV_SDK_KERNEL(gelu_out), FLOATS, NOCPU)                          \
  K("aten::gelu_backward.grad_input", "", MAXDEV_SDK_KERNEL(gelu_backward_out), FLOATS, NOCPU) \
  K("aten::sum.IntList_out", "", MAXDEV_SDK_KERNEL(sum_out), FLOATS, NOCPU)                    \
  K("aten::mean.out", "", MAXDEV_SDK_KERNEL(mean_out), FLOATS, NOCPU)                          \
  K("aten::_softmax.out", "", MAXDEV_SDK_KERNEL(softmax_out), FLOATS, NOCPU)                   \
  K("aten::_log_softmax.out", "", MAXDEV_SDK_KERNEL(log_softmax_out), FLOATS, NOCPU)           \
  K("aten::_softmax_backward_data.out", "", MAXDEV_SDK_KERNEL(softmax_backward_out), FLOATS, NOCPU) \
  K("aten::_log_softmax_backward_data.out", "", MAXDEV_SDK_KERNEL(log_softmax_backward_out), FLOATS, NOCPU) \
  K("aten::mm.out", "", MAXDEV_SDK_KERNEL(mm_out), F32, NOCPU)                                 \
  K("aten::addmm.out", "", MAXDEV_SDK_KERNEL(addmm_out), F32, NOCPU)                           \
  K("aten::bmm.out", "", MAXDEV_SDK_KERNEL(bmm_out), F32, NOCPU)                               \
  K("aten::native_layer_norm", "", MAXDEV_SDK_KERNEL(native_layer_norm), FLOATS, NOCPU)        \
  K("aten::native_layer_norm_backward", "", MAXDEV_SDK_KERNEL(native_layer_norm_backward), FLOATS, NOCPU) \
  K("aten::embedding", "", MAXDEV_SDK_KERNEL(embedding), FLOATS | INDICES, NOCPU)              \
  K("aten::embedding_dense_backward", "", MAXDEV_SDK_KERNEL(embedding_dense_backward), FLOATS | INDICES, NOCPU) \
  K("aten::_fused_adamw_", "", MAXDEV_SDK_KERNEL(fused_adamw), FLOATS, NOCPU)

MAXDEV_DEFINE_PLUGIN("fast", "1.0.0", FAST_KERNELS, init, teardown)
