/*
 * reference — the max_device reference plugin: plain C99 against plugin.h.
 *
 * float32 kernels for common aten ops. Every kernel handles arbitrary
 * strides (the C SDK's strided iterator, max_device/sdk.h, serves all of
 * them), binary ops broadcast, and a 0-dim CPU tensor operand (`x + torch.tensor(2.)`, or the
 * wrapped number of `x + 2`) is read as a scalar. Anything else — other
 * dtypes, CPU tensors that are not 0-dim, outputs that overlap inputs in a
 * way a kernel cannot handle, shapes a kernel does not expect (an out=
 * tensor that must be resized, operands that do not broadcast) — is
 * declined, and PyTorch's CPU kernel runs: it resizes, or raises PyTorch's
 * own error.
 *
 * Kernels keep no global state and are safe to call from several threads.
 *
 * The same file builds two plugins:
 *   REFERENCE_VERSION=1 (default): libreference.so,    version "1.0.0"
 *   REFERENCE_VERSION=2:           libreference_v2.so, version "2.0.0"
 * They differ observably in exactly one way: the custom op
 * `reference::version(Tensor x) -> Tensor` returns a float32 tensor shaped
 * like x filled with 1.0 (v1) or 2.0 (v2). A hot-swap test loads one, then
 * the other, and tells which serves from that op. (Both also carry their
 * version string in the manifest and the plugin definition.)
 */
#include <max_device/plugin.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef REFERENCE_VERSION
#define REFERENCE_VERSION 1
#endif
#if REFERENCE_VERSION == 1
#define REFERENCE_VERSION_STRING "1.0.0"
#elif REFERENCE_VERSION == 2
#define REFERENCE_VERSION_STRING "2.0.0"
#else
#error "REFERENCE_VERSION must be 1 or 2"
#endif

/* Most dimensions a kernel handles; more is declined. */
#define REF_MAX_DIMS 32

typedef maxdev_status status;

/* ===========================================================================
 * Small checks and argument access. A wrong argument kind means the host and
 * this plugin disagree about a schema: decline rather than guess.
 * ========================================================================= */

static int is_f32(const maxdev_tensor* t) {
  return maxdev_dtype_is(t->dtype, MAXDEV_TYPE_FLOAT, 32);
}

static int is_device(const maxdev_tensor* t) {
  return t->device.device_type == MAXDEV_DEVICE_MAX;
}

static int is_device_f32(const maxdev_tensor* t) {
  return t != NULL && is_device(t) && is_f32(t) && t->ndim <= REF_MAX_DIMS;
}

static const maxdev_value* arg(const maxdev_call* c, int i, int32_t kind) {
  if (i < 0 || i >= c->num_args || c->args[i].kind != kind) return NULL;
  return &c->args[i];
}

static const maxdev_tensor* arg_tensor(const maxdev_call* c, int i) {
  const maxdev_value* v = arg(c, i, MAXDEV_VALUE_TENSOR);
  return v != NULL ? v->u.tensor : NULL;
}

static int arg_int(const maxdev_call* c, int i, int64_t* out) {
  const maxdev_value* v = arg(c, i, MAXDEV_VALUE_INT);
  if (v == NULL) return 0;
  *out = v->u.i;
  return 1;
}

static int arg_bool(const maxdev_call* c, int i, int* out) {
  const maxdev_value* v = arg(c, i, MAXDEV_VALUE_BOOL);
  if (v == NULL) return 0;
  *out = v->u.b != 0;
  return 1;
}

/* A Scalar (int, float or bool) as a double. */
static int arg_real(const maxdev_call* c, int i, double* out) {
  if (i < 0 || i >= c->num_args) return 0;
  switch (c->args[i].kind) {
    case MAXDEV_VALUE_INT:
    case MAXDEV_VALUE_FLOAT:
    case MAXDEV_VALUE_BOOL:
      *out = maxdev_value_as_double(&c->args[i]);
      return 1;
    default:
      return 0;
  }
}

/* A `ScalarType?` argument: None, or float32. Anything else declines. */
static int arg_dtype_none_or_f32(const maxdev_call* c, int i) {
  if (i < 0 || i >= c->num_args) return 0;
  if (c->args[i].kind == MAXDEV_VALUE_NONE) return 1;
  if (c->args[i].kind != MAXDEV_VALUE_DTYPE) return 0;
  return maxdev_dtype_is(c->args[i].u.dtype, MAXDEV_TYPE_FLOAT, 32);
}

/* Output i of the call: set by the host for out= and in-place ops. */
static const maxdev_tensor* output(const maxdev_call* c, int i) {
  if (i < 0 || i >= c->num_outputs || c->outputs == NULL) return NULL;
  return c->outputs[i];
}

/* PyTorch's dim wrapping; a 0-dim tensor accepts dims -1 and 0. */
static int wrap_dim(int64_t dim, int32_t ndim, int32_t* out) {
  const int64_t n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n) return 0;
  *out = (int32_t)(dim < 0 ? dim + n : dim);
  return 1;
}

static int same_shape(const maxdev_tensor* a, const maxdev_tensor* b) {
  if (a->ndim != b->ndim) return 0;
  for (int32_t d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}


/* ===========================================================================
 * Memory overlap between an output and an input (maxdev_tensor_overlap).
 * ========================================================================= */

/* Whether out and in share any byte. */
static int ranges_overlap(const maxdev_tensor* out, const maxdev_tensor* in) {
  return maxdev_tensor_overlap(out, in) != MAXDEV_OVERLAP_NONE;
}

/* Whether writing `out` while reading `in` element by element is unsafe:
 * they share memory, and not as the very same elements. */
static int unsafe_overlap(const maxdev_tensor* out, const maxdev_tensor* in) {
  return maxdev_tensor_overlap(out, in) == MAXDEV_OVERLAP_PARTIAL;
}

/* Byte strides of t broadcast to (ndim, shape): aligned from the right,
 * stride 0 where t lacks the dimension or has size 1. 0 if t does not
 * broadcast to the shape. (addmm's bias, read as a matrix.) */
static int broadcast_strides(const maxdev_tensor* t, int32_t ndim,
                             const int64_t* shape, int64_t* strides) {
  const int32_t lead = ndim - t->ndim;
  if (lead < 0) return 0;
  for (int32_t d = 0; d < ndim; ++d) {
    const int32_t td = d - lead;
    if (td < 0 || t->shape[td] == 1) {
      strides[d] = 0;
    } else if (t->shape[td] == shape[d]) {
      strides[d] = t->strides[td] * maxdev_dtype_size(t->dtype);
    } else {
      return 0;
    }
  }
  return 1;
}

/* A row of the iteration: n elements; operand k starts at ptr[k] and steps
 * step[k] bytes. */
typedef void (*row_fn)(char* const* ptr, const int64_t* step, int64_t n,
                       void* ctx);

/* Hands every span of a set-up iteration to fn. */
static void iter_run(maxdev_iter* it, row_fn fn, void* ctx) {
  maxdev_span span;
  while (maxdev_iter_next(it, &span)) fn(span.ptr, span.step, span.n, ctx);
}

/* ===========================================================================
 * Element-wise ops: one row function for all of them.
 * ========================================================================= */

typedef enum ew_op {
  EW_ADD, EW_MUL, EW_DIV, /* binary; sub is add with -alpha */
  EW_NEG, EW_RELU, EW_GELU, EW_GELU_TANH, EW_EXP, EW_TANH, EW_SIGMOID
} ew_op;

typedef struct ew_ctx {
  ew_op op;
  float alpha;
} ew_ctx;

static float gelu_erf(float x) {
  const double v = x;
  return (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
}

static float gelu_tanh(float x) {
  const double v = x;
  const double k = 0.79788456080286535588; /* sqrt(2/pi) */
  return (float)(0.5 * v * (1.0 + tanh(k * (v + 0.044715 * v * v * v))));
}

static float relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }

static float sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

#define EW_AT(k, i, type) (*(type*)(p[k] + (i) * s[k]))
/* Rows whose operands are all dense take a plain indexed loop, which the
 * compiler vectorizes; other rows step by their byte strides. */
#define EW_DENSE(k) (s[k] == (int64_t)sizeof(float))
#define EW_UNARY(expr)                                   \
  if (EW_DENSE(0) && EW_DENSE(1)) {                      \
    float* o = (float*)p[0];                             \
    const float* x = (const float*)p[1];                 \
    for (int64_t i = 0; i < n; ++i) {                    \
      const float a = x[i];                              \
      o[i] = (expr);                                     \
    }                                                    \
  } else {                                               \
    for (int64_t i = 0; i < n; ++i) {                    \
      const float a = EW_AT(1, i, const float);          \
      EW_AT(0, i, float) = (expr);                       \
    }                                                    \
  }                                                      \
  break
#define EW_BINARY(expr)                                  \
  if (EW_DENSE(0) && EW_DENSE(1) && EW_DENSE(2)) {       \
    float* o = (float*)p[0];                             \
    const float* x = (const float*)p[1];                 \
    const float* y = (const float*)p[2];                 \
    for (int64_t i = 0; i < n; ++i) {                    \
      const float a = x[i], b = y[i];                    \
      o[i] = (expr);                                     \
    }                                                    \
  } else {                                               \
    for (int64_t i = 0; i < n; ++i) {                    \
      const float a = EW_AT(1, i, const float);          \
      const float b = EW_AT(2, i, const float);          \
      EW_AT(0, i, float) = (expr);                       \
    }                                                    \
  }                                                      \
  break

static void ew_row(char* const* p, const int64_t* s, int64_t n, void* vctx) {
  const ew_ctx* ctx = (const ew_ctx*)vctx;
  const float alpha = ctx->alpha;
  switch (ctx->op) {
    case EW_ADD: EW_BINARY(a + alpha * b);
    case EW_MUL: EW_BINARY(a * b);
    case EW_DIV: EW_BINARY(a / b);
    case EW_NEG: EW_UNARY(-a);
    case EW_RELU: EW_UNARY(relu(a));
    case EW_GELU: EW_UNARY(gelu_erf(a));
    case EW_GELU_TANH: EW_UNARY(gelu_tanh(a));
    case EW_EXP: EW_UNARY(expf(a));
    case EW_TANH: EW_UNARY(tanhf(a));
    case EW_SIGMOID: EW_UNARY(sigmoid(a));
  }
}

/* A 0-dim CPU tensor of any real dtype read as a float32 scalar, with a
 * 0-dim view of it. */
typedef struct scalar_view {
  float value;
  maxdev_tensor view;
} scalar_view;

static int read_cpu_scalar(const maxdev_tensor* t, scalar_view* sv) {
  double v;
  if (t->ndim != 0 || maxdev_scalar_to_double(t, &v, NULL) != MAXDEV_OK) return 0;
  memset(&sv->view, 0, sizeof(sv->view));
  sv->value = (float)v;
  sv->view.data = &sv->value;
  sv->view.device.device_type = MAXDEV_DEVICE_CPU;
  sv->view.dtype = maxdev_dtype_of_bit(MAXDEV_DTYPE_FLOAT32);
  return 1;
}

/* An element-wise input: a float32 device tensor, or a 0-dim CPU scalar
 * (converted into *sv). NULL to decline. */
static const maxdev_tensor* ew_input(const maxdev_tensor* t, scalar_view* sv) {
  if (t == NULL) return NULL;
  if (t->device.device_type == MAXDEV_DEVICE_CPU)
    return read_cpu_scalar(t, sv) ? &sv->view : NULL;
  return is_device_f32(t) ? t : NULL;
}

/* out = op(a[, b]) with broadcasting; b is NULL for unary ops. */
static status ew_apply(ew_op op, double alpha,
                       const maxdev_tensor* out, const maxdev_tensor* a_in,
                       const maxdev_tensor* b_in) {
  scalar_view sa, sb;
  const maxdev_tensor* a = ew_input(a_in, &sa);
  const maxdev_tensor* b = b_in != NULL ? ew_input(b_in, &sb) : NULL;
  if (!is_device_f32(out) || a == NULL || (b_in != NULL && b == NULL))
    return MAXDEV_DECLINED;
  if (unsafe_overlap(out, a) || (b != NULL && unsafe_overlap(out, b)))
    return MAXDEV_DECLINED;

  /* The inputs' broadcast shape must be out's (else PyTorch resizes). */
  const maxdev_tensor* ops[3] = {out, a, b};
  const int32_t nops = b != NULL ? 3 : 2;
  int32_t ndim;
  int64_t shape[REF_MAX_DIMS];
  if (maxdev_broadcast_shape(nops - 1, ops + 1, REF_MAX_DIMS, shape, &ndim, NULL) != MAXDEV_OK ||
      ndim != out->ndim)
    return MAXDEV_DECLINED;
  for (int32_t d = 0; d < ndim; ++d)
    if (shape[d] != out->shape[d])
      return MAXDEV_DECLINED;

  maxdev_iter it;
  if (maxdev_iter_init(&it, out->ndim, out->shape, nops, ops, NULL) != MAXDEV_OK)
    return MAXDEV_DECLINED;
  ew_ctx ctx;
  ctx.op = op;
  ctx.alpha = (float)alpha;
  iter_run(&it, ew_row, &ctx);
  return MAXDEV_OK;
}

/* --- binary ops: (self, other, [*, alpha], out) --------------------------- */

static status binary_out(const maxdev_call* c, ew_op op, int has_alpha,
                         double sign) {
  double alpha = 1.0;
  if (c->num_args != (has_alpha ? 4 : 3)) return MAXDEV_DECLINED;
  if (has_alpha && !arg_real(c, 2, &alpha)) return MAXDEV_DECLINED;
  return ew_apply(op, sign * alpha, output(c, 0), arg_tensor(c, 0),
                  arg_tensor(c, 1));
}

static status add_out(const maxdev_call* c) { return binary_out(c, EW_ADD, 1, 1.0); }
static status sub_out(const maxdev_call* c) { return binary_out(c, EW_ADD, 1, -1.0); }
static status mul_out(const maxdev_call* c) { return binary_out(c, EW_MUL, 0, 1.0); }
static status div_out(const maxdev_call* c) { return binary_out(c, EW_DIV, 0, 1.0); }

/* --- unary ops: (self, *, out) --------------------------------------------- */

static status unary_out(const maxdev_call* c, ew_op op) {
  if (c->num_args != 2) return MAXDEV_DECLINED;
  return ew_apply(op, 1.0, output(c, 0), arg_tensor(c, 0), NULL);
}

static status neg_out(const maxdev_call* c) { return unary_out(c, EW_NEG); }
static status exp_out(const maxdev_call* c) { return unary_out(c, EW_EXP); }
static status tanh_out(const maxdev_call* c) { return unary_out(c, EW_TANH); }
static status sigmoid_out(const maxdev_call* c) { return unary_out(c, EW_SIGMOID); }
static status relu_out(const maxdev_call* c) { return unary_out(c, EW_RELU); }

/* aten::relu(Tensor self) -> Tensor: not structured, allocates its output. */
static status relu_functional(const maxdev_call* c) {
  const maxdev_tensor* self = arg_tensor(c, 0);
  const maxdev_tensor* out = NULL;
  if (c->num_args != 1 || !is_device_f32(self)) return MAXDEV_DECLINED;
  if (c->host->alloc_output(c->ctx, 0, self->dtype, self->ndim, self->shape,
                            &out) != MAXDEV_OK)
    return MAXDEV_ERROR;
  return ew_apply(EW_RELU, 1.0, out, self, NULL);
}

/* aten::relu_(Tensor(a!) self) -> Tensor(a!): in place; outputs[0] is self. */
static status relu_inplace(const maxdev_call* c) {
  const maxdev_tensor* self = arg_tensor(c, 0);
  const maxdev_tensor* out = output(c, 0);
  if (c->num_args != 1) return MAXDEV_DECLINED;
  return ew_apply(EW_RELU, 1.0, out != NULL ? out : self, self, NULL);
}

/* aten::gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) */
static status gelu_out(const maxdev_call* c) {
  const maxdev_value* approx = arg(c, 1, MAXDEV_VALUE_STRING);
  if (c->num_args != 3 || approx == NULL || approx->u.string == NULL)
    return MAXDEV_DECLINED;
  if (strcmp(approx->u.string, "none") == 0)
    return ew_apply(EW_GELU, 1.0, output(c, 0), arg_tensor(c, 0), NULL);
  if (strcmp(approx->u.string, "tanh") == 0)
    return ew_apply(EW_GELU_TANH, 1.0, output(c, 0), arg_tensor(c, 0), NULL);
  return MAXDEV_DECLINED;
}

/* ===========================================================================
 * Reductions: sum.IntList_out and mean.out
 *   (Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None,
 *    Tensor(a!) out)
 * An outer iterator walks the kept dimensions (out, self); for each output
 * element an inner iterator walks the reduced dimensions of self.
 * Accumulation is in double.
 * ========================================================================= */

typedef struct reduce_ctx {
  maxdev_iter inner;  /* one operand: self over the reduced dimensions */
  double acc;
  double scale;   /* 1 for sum, 1/count for mean */
} reduce_ctx;

static void reduce_inner_row(char* const* p, const int64_t* s, int64_t n,
                             void* vctx) {
  reduce_ctx* ctx = (reduce_ctx*)vctx;
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += EW_AT(0, i, const float);
  ctx->acc += acc;
}

static void reduce_outer_row(char* const* p, const int64_t* s, int64_t n,
                             void* vctx) {
  reduce_ctx* ctx = (reduce_ctx*)vctx;
  for (int64_t i = 0; i < n; ++i) {
    char* base = p[1] + i * s[1];
    ctx->acc = 0.0;
    maxdev_iter_restart(&ctx->inner, &base);
    iter_run(&ctx->inner, reduce_inner_row, ctx);
    EW_AT(0, i, float) = (float)(ctx->acc * ctx->scale);
  }
}

static status reduce_out(const maxdev_call* c, int mean) {
  const maxdev_tensor* self = arg_tensor(c, 0);
  const maxdev_tensor* out = output(c, 0);
  int keepdim = 0;
  if (c->num_args != 5 || !is_device_f32(self) || !is_device_f32(out) ||
      !arg_bool(c, 2, &keepdim) || !arg_dtype_none_or_f32(c, 3))
    return MAXDEV_DECLINED;
  if (ranges_overlap(out, self)) return MAXDEV_DECLINED;

  /* Which dimensions are reduced: None or [] means all. */
  int reduced[REF_MAX_DIMS] = {0};
  const maxdev_value* dims = arg(c, 1, MAXDEV_VALUE_INT_LIST);
  if (dims == NULL && c->args[1].kind != MAXDEV_VALUE_NONE) return MAXDEV_DECLINED;
  if (dims == NULL || dims->u.int_list.size == 0) {
    for (int32_t d = 0; d < self->ndim; ++d) reduced[d] = 1;
  } else {
    for (int64_t j = 0; j < dims->u.int_list.size; ++j) {
      int32_t d;
      if (!wrap_dim(dims->u.int_list.data[j], self->ndim, &d)) return MAXDEV_DECLINED;
      if (self->ndim == 0) continue; /* a scalar: nothing to reduce */
      if (reduced[d]) return MAXDEV_DECLINED; /* repeated dim */
      reduced[d] = 1;
    }
  }

  /* Expected output shape, the kept and reduced shapes, and strides. */
  int64_t kept_shape[REF_MAX_DIMS], red_shape[REF_MAX_DIMS];
  int64_t out_strides[REF_MAX_DIMS], kept_strides[REF_MAX_DIMS], red_strides[REF_MAX_DIMS];
  int32_t nkept = 0, nred = 0, od = 0;
  int64_t count = 1;
  const int64_t es = maxdev_dtype_size(self->dtype);
  for (int32_t d = 0; d < self->ndim; ++d) {
    if (reduced[d]) {
      if (keepdim) {
        if (od >= out->ndim || out->shape[od] != 1) goto shape_error;
        ++od;
      }
      red_shape[nred] = self->shape[d];
      red_strides[nred] = self->strides[d] * es;
      ++nred;
      count *= self->shape[d];
    } else {
      if (od >= out->ndim || out->shape[od] != self->shape[d]) goto shape_error;
      kept_shape[nkept] = self->shape[d];
      out_strides[nkept] = out->strides[od] * maxdev_dtype_size(out->dtype);
      kept_strides[nkept] = self->strides[d] * es;
      ++nkept;
      ++od;
    }
  }
  if (od != out->ndim) goto shape_error;

  /* outer: (out, self) over the kept dimensions; inner: self over the
   * reduced ones, restarted below each output element. */
  reduce_ctx ctx;
  maxdev_iter outer;
  char* base[2] = {(char*)maxdev_tensor_data(out), (char*)maxdev_tensor_data(self)};
  const int64_t item[2] = {maxdev_dtype_size(out->dtype), es};
  int64_t outer_strides[2 * REF_MAX_DIMS];
  for (int32_t d = 0; d < nkept; ++d) {
    outer_strides[d] = out_strides[d];
    outer_strides[nkept + d] = kept_strides[d];
  }
  if (maxdev_iter_init_strided(&ctx.inner, nred, red_shape, 1, base + 1, red_strides, item + 1, NULL) !=
          MAXDEV_OK ||
      maxdev_iter_init_strided(&outer, nkept, kept_shape, 2, base, outer_strides, item, NULL) != MAXDEV_OK)
    return MAXDEV_DECLINED;
  /* Reducing over nothing: the inner walk adds no element, so sum is 0 and
   * mean is 0 * NaN = NaN, as in PyTorch. */
  ctx.scale = !mean ? 1.0 : count == 0 ? NAN : 1.0 / (double)count;
  iter_run(&outer, reduce_outer_row, &ctx);
  return MAXDEV_OK;

shape_error:
  return MAXDEV_DECLINED;
}

static status sum_out(const maxdev_call* c) { return reduce_out(c, 0); }
static status mean_out(const maxdev_call* c) { return reduce_out(c, 1); }

/* ===========================================================================
 * Matrix products. out[i, j] = alpha * sum_p a[i, p] b[p, j]
 *                              + beta * bias[i, j]   (beta != 0 only)
 * Strides in bytes; accumulation in double, one output row at a time.
 * ========================================================================= */

typedef struct mat {
  char* p;
  int64_t s0, s1; /* byte strides */
} mat;

static mat mat_of(const maxdev_tensor* t, int32_t first_dim) {
  mat m;
  m.p = (char*)maxdev_tensor_data(t);
  m.s0 = t->strides[first_dim] * maxdev_dtype_size(t->dtype);
  m.s1 = t->strides[first_dim + 1] * maxdev_dtype_size(t->dtype);
  return m;
}

#define MAT_AT(m, i, j) (*(float*)((m).p + (i) * (m).s0 + (j) * (m).s1))

static void matmul(mat out, mat a, mat b, const mat* bias, double beta,
                   double alpha, int64_t n, int64_t k, int64_t m, double* acc) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) acc[j] = 0.0;
    for (int64_t q = 0; q < k; ++q) {
      const double aiq = MAT_AT(a, i, q);
      for (int64_t j = 0; j < m; ++j) acc[j] += aiq * MAT_AT(b, q, j);
    }
    for (int64_t j = 0; j < m; ++j) {
      double v = alpha * acc[j];
      if (bias != NULL && beta != 0.0) v += beta * MAT_AT(*bias, i, j);
      MAT_AT(out, i, j) = (float)v;
    }
  }
}

static double* alloc_acc(int64_t m) {
  return (double*)malloc((size_t)(m > 0 ? m : 1) * sizeof(double));
}

/* mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out)
 * bmm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) */
static status mm_like(const maxdev_call* c, int batched) {
  const maxdev_tensor* a = arg_tensor(c, 0);
  const maxdev_tensor* b = arg_tensor(c, 1);
  const maxdev_tensor* out = output(c, 0);
  const int32_t nd = batched ? 3 : 2, o = batched ? 1 : 0;
  if (c->num_args != 3 || !is_device_f32(a) || !is_device_f32(b) ||
      !is_device_f32(out) || a->ndim != nd || b->ndim != nd)
    return MAXDEV_DECLINED;
  if (ranges_overlap(out, a) || ranges_overlap(out, b)) return MAXDEV_DECLINED;
  const int64_t batch = batched ? a->shape[0] : 1;
  const int64_t n = a->shape[o], k = a->shape[o + 1], m = b->shape[o + 1];
  if (b->shape[o] != k || out->ndim != nd || out->shape[o] != n ||
      out->shape[o + 1] != m || (batched && (b->shape[0] != batch || out->shape[0] != batch)))
    return MAXDEV_DECLINED;
  double* acc = alloc_acc(m);
  if (acc == NULL) return c->host->set_error(c->ctx, "reference: out of memory");
  for (int64_t bi = 0; bi < batch; ++bi) {
    mat ma = mat_of(a, o), mb = mat_of(b, o), mo = mat_of(out, o);
    if (batched) {
      ma.p += bi * a->strides[0] * maxdev_dtype_size(a->dtype);
      mb.p += bi * b->strides[0] * maxdev_dtype_size(b->dtype);
      mo.p += bi * out->strides[0] * maxdev_dtype_size(out->dtype);
    }
    matmul(mo, ma, mb, NULL, 0.0, 1.0, n, k, m, acc);
  }
  free(acc);
  return MAXDEV_OK;
}

static status mm_out(const maxdev_call* c) { return mm_like(c, 0); }
static status bmm_out(const maxdev_call* c) { return mm_like(c, 1); }

/* addmm.out(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1,
 *           Scalar alpha=1, Tensor(a!) out); self broadcasts to out. */
static status addmm_out(const maxdev_call* c) {
  const maxdev_tensor* self = arg_tensor(c, 0);
  const maxdev_tensor* a = arg_tensor(c, 1);
  const maxdev_tensor* b = arg_tensor(c, 2);
  const maxdev_tensor* out = output(c, 0);
  double beta, alpha;
  if (c->num_args != 6 || !is_device_f32(self) || !is_device_f32(a) ||
      !is_device_f32(b) || !is_device_f32(out) || a->ndim != 2 ||
      b->ndim != 2 || !arg_real(c, 3, &beta) || !arg_real(c, 4, &alpha))
    return MAXDEV_DECLINED;
  if (ranges_overlap(out, a) || ranges_overlap(out, b) ||
      unsafe_overlap(out, self))
    return MAXDEV_DECLINED;
  const int64_t n = a->shape[0], k = a->shape[1], m = b->shape[1];
  if (b->shape[0] != k || out->ndim != 2 || out->shape[0] != n ||
      out->shape[1] != m)
    return MAXDEV_DECLINED;
  int64_t bias_strides[2];
  if (!broadcast_strides(self, 2, out->shape, bias_strides))
    return MAXDEV_DECLINED;
  mat bias;
  bias.p = (char*)maxdev_tensor_data(self);
  bias.s0 = bias_strides[0];
  bias.s1 = bias_strides[1];
  double* acc = alloc_acc(m);
  if (acc == NULL) return c->host->set_error(c->ctx, "reference: out of memory");
  matmul(mat_of(out, 0), mat_of(a, 0), mat_of(b, 0), &bias, beta, alpha, n, k,
         m, acc);
  free(acc);
  return MAXDEV_OK;
}

/* ===========================================================================
 * Softmax family: along one dimension. An iterator walks every other
 * dimension; for each position a row function gets a 1-d strided vector per
 * operand (output first).
 * ========================================================================= */

typedef enum sm_op { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_SOFTMAX_BWD, SM_LOG_SOFTMAX_BWD } sm_op;

/* Most operands of a softmax kernel: grad_input, grad_output, output. */
#define SM_MAX_OPS 3

typedef struct sm_ctx {
  sm_op op;
  int64_t len;               /* size of the softmax dimension */
  int64_t vstep[SM_MAX_OPS]; /* byte strides along it */
} sm_ctx;

#define SM_V(k, j) (*(float*)(q[k] + (j) * ctx->vstep[k]))

static void sm_vector(const sm_ctx* ctx, char* const* q) {
  const int64_t len = ctx->len;
  switch (ctx->op) {
    case SM_SOFTMAX:
    case SM_LOG_SOFTMAX: { /* q: out, self */
      float mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j)
        if (SM_V(1, j) > mx || SM_V(1, j) != SM_V(1, j)) mx = SM_V(1, j);
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) sum += exp((double)SM_V(1, j) - mx);
      if (ctx->op == SM_SOFTMAX) {
        for (int64_t j = 0; j < len; ++j)
          SM_V(0, j) = (float)(exp((double)SM_V(1, j) - mx) / sum);
      } else {
        const double lse = log(sum);
        for (int64_t j = 0; j < len; ++j)
          SM_V(0, j) = (float)((double)SM_V(1, j) - mx - lse);
      }
      break;
    }
    case SM_SOFTMAX_BWD: { /* q: grad_input, grad_output, output */
      double dot = 0.0;
      for (int64_t j = 0; j < len; ++j) dot += (double)SM_V(1, j) * SM_V(2, j);
      for (int64_t j = 0; j < len; ++j)
        SM_V(0, j) = (float)((double)SM_V(2, j) * ((double)SM_V(1, j) - dot));
      break;
    }
    case SM_LOG_SOFTMAX_BWD: { /* q: grad_input, grad_output, output */
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) sum += SM_V(1, j);
      for (int64_t j = 0; j < len; ++j)
        SM_V(0, j) = (float)((double)SM_V(1, j) - exp((double)SM_V(2, j)) * sum);
      break;
    }
  }
}

static void sm_row(char* const* p, const int64_t* s, int64_t n, void* vctx) {
  const sm_ctx* ctx = (const sm_ctx*)vctx;
  char* q[SM_MAX_OPS];
  const int32_t nops = ctx->op == SM_SOFTMAX || ctx->op == SM_LOG_SOFTMAX ? 2 : 3;
  for (int64_t i = 0; i < n; ++i) {
    for (int32_t k = 0; k < nops; ++k) q[k] = p[k] + i * s[k];
    sm_vector(ctx, q);
  }
}

/* ts[0] is the output; all have one shape; dim is the softmax dimension. */
static status sm_apply(sm_op op, int64_t dim,
                       int32_t nops, const maxdev_tensor* const* ts) {
  for (int32_t k = 0; k < nops; ++k)
    if (!is_device_f32(ts[k])) return MAXDEV_DECLINED;
  for (int32_t k = 1; k < nops; ++k) {
    if (!same_shape(ts[0], ts[k]))
      return MAXDEV_DECLINED;
    if (unsafe_overlap(ts[0], ts[k])) return MAXDEV_DECLINED;
  }
  const maxdev_tensor* t0 = ts[0];
  int32_t d;
  if (!wrap_dim(dim, t0->ndim, &d)) return MAXDEV_DECLINED;

  sm_ctx ctx;
  ctx.op = op;
  ctx.len = t0->ndim == 0 ? 1 : t0->shape[d];
  int64_t shape[REF_MAX_DIMS], strides[SM_MAX_OPS * REF_MAX_DIMS], item[SM_MAX_OPS];
  char* base[SM_MAX_OPS];
  for (int32_t k = 0; k < nops; ++k) {
    base[k] = (char*)maxdev_tensor_data(ts[k]);
    item[k] = maxdev_dtype_size(ts[k]->dtype);
    ctx.vstep[k] = t0->ndim == 0 ? 0 : ts[k]->strides[d] * item[k];
  }
  /* The other dimensions: the softmax one gets size 1. */
  for (int32_t e = 0; e < t0->ndim; ++e) {
    shape[e] = e == d ? 1 : t0->shape[e];
    for (int32_t k = 0; k < nops; ++k)
      strides[k * t0->ndim + e] = ts[k]->strides[e] * item[k];
  }
  if (ctx.len == 0) return MAXDEV_OK;
  maxdev_iter it;
  if (maxdev_iter_init_strided(&it, t0->ndim, shape, nops, base, strides, item, NULL) != MAXDEV_OK)
    return MAXDEV_DECLINED;
  iter_run(&it, sm_row, &ctx);
  return MAXDEV_OK;
}

/* _softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out) */
static status softmax_like(const maxdev_call* c, sm_op op) {
  int64_t dim;
  int half_to_float;
  if (c->num_args != 4 || !arg_int(c, 1, &dim) || !arg_bool(c, 2, &half_to_float) ||
      half_to_float)
    return MAXDEV_DECLINED;
  const maxdev_tensor* ts[2] = {output(c, 0), arg_tensor(c, 0)};
  return sm_apply(op, dim, 2, ts);
}

/* _softmax_backward_data.out(Tensor grad_output, Tensor output, int dim,
 *   ScalarType input_dtype, *, Tensor(a!) grad_input) */
static status softmax_bwd_like(const maxdev_call* c, sm_op op) {
  int64_t dim;
  const maxdev_value* input_dtype = arg(c, 3, MAXDEV_VALUE_DTYPE);
  if (c->num_args != 5 || !arg_int(c, 2, &dim) || input_dtype == NULL ||
      !maxdev_dtype_is(input_dtype->u.dtype, MAXDEV_TYPE_FLOAT, 32))
    return MAXDEV_DECLINED;
  const maxdev_tensor* ts[3] = {output(c, 0), arg_tensor(c, 0), arg_tensor(c, 1)};
  return sm_apply(op, dim, 3, ts);
}

static status softmax_out(const maxdev_call* c) { return softmax_like(c, SM_SOFTMAX); }
static status log_softmax_out(const maxdev_call* c) { return softmax_like(c, SM_LOG_SOFTMAX); }
static status softmax_bwd_out(const maxdev_call* c) { return softmax_bwd_like(c, SM_SOFTMAX_BWD); }
static status log_softmax_bwd_out(const maxdev_call* c) {
  return softmax_bwd_like(c, SM_LOG_SOFTMAX_BWD);
}

/* ===========================================================================
 * reference::version(Tensor x) -> Tensor: float32 shaped like x, filled with
 * REFERENCE_VERSION (1.0 or 2.0). The one observable v1/v2 difference.
 * ========================================================================= */

static status version_op(const maxdev_call* c) {
  const maxdev_tensor* x = arg_tensor(c, 0);
  const maxdev_tensor* out = NULL;
  maxdev_dtype f32;
  f32.code = MAXDEV_TYPE_FLOAT;
  f32.bits = 32;
  f32.lanes = 1;
  if (c->num_args != 1 || x == NULL) return MAXDEV_DECLINED;
  if (c->host->alloc_output(c->ctx, 0, f32, x->ndim, x->shape, &out) != MAXDEV_OK)
    return MAXDEV_ERROR;
  float* p = (float*)maxdev_tensor_data(out);
  const int64_t n = maxdev_tensor_numel(out);
  for (int64_t i = 0; i < n; ++i) p[i] = (float)REFERENCE_VERSION;
  return MAXDEV_OK;
}

/* ===========================================================================
 * The plugin. Binary ops accept dtypes 0 ("any") because a CPU scalar operand
 * may be int64/float64/bool; they check dtypes themselves.
 * ========================================================================= */

#define F32 MAXDEV_DTYPE_FLOAT32
#define NOCPU MAXDEV_KERNEL_NO_CPU_TENSORS

#define REFERENCE_KERNELS(K)                                                  \
  K("aten::add.out", "", add_out, 0, 0)                                       \
  K("aten::sub.out", "", sub_out, 0, 0)                                       \
  K("aten::mul.out", "", mul_out, 0, 0)                                       \
  K("aten::div.out", "", div_out, 0, 0)                                       \
  K("aten::neg.out", "", neg_out, F32, NOCPU)                                 \
  K("aten::relu", "", relu_functional, F32, NOCPU)                            \
  K("aten::relu_", "", relu_inplace, F32, NOCPU)                              \
  K("aten::relu.out", "", relu_out, F32, NOCPU)                               \
  K("aten::gelu.out", "", gelu_out, F32, NOCPU)                               \
  K("aten::exp.out", "", exp_out, F32, NOCPU)                                 \
  K("aten::tanh.out", "", tanh_out, F32, NOCPU)                               \
  K("aten::sigmoid.out", "", sigmoid_out, F32, NOCPU)                         \
  K("aten::sum.IntList_out", "", sum_out, F32, NOCPU)                         \
  K("aten::mean.out", "", mean_out, F32, NOCPU)                               \
  K("aten::mm.out", "", mm_out, F32, NOCPU)                                   \
  K("aten::addmm.out", "", addmm_out, F32, NOCPU)                             \
  K("aten::bmm.out", "", bmm_out, F32, NOCPU)                                 \
  K("aten::_softmax.out", "", softmax_out, F32, NOCPU)                        \
  K("aten::_log_softmax.out", "", log_softmax_out, F32, NOCPU)                \
  K("aten::_softmax_backward_data.out", "", softmax_bwd_out, F32, NOCPU)      \
  K("aten::_log_softmax_backward_data.out", "", log_softmax_bwd_out, F32,     \
    NOCPU)                                                                    \
  K("reference::version", "reference::version(Tensor x) -> Tensor",           \
    version_op, 0, 0)

MAXDEV_DEFINE_PLUGIN("reference", REFERENCE_VERSION_STRING, REFERENCE_KERNELS,
                     NULL, NULL)
