/*
 * max_device C SDK — the helpers every kernel rewrites, for plugins in C.
 *
 * plugin.h includes this header, so a plugin still includes one header.
 * The C++ SDK (plugin.hpp) wraps these functions instead of repeating them:
 * one implementation of each helper for both languages.
 *
 *   dtypes     element sizes, PyTorch's names, the MAXDEV_DTYPE_* bit of a
 *              dtype (a C kernel dispatches with a switch on it), and
 *              float16 / bfloat16 <-> float conversions
 *   scalars    the value of a one-element tensor of any real dtype or bool
 *              (the 0-dim CPU tensor of `torch.mul(x, 2.5)`)
 *   overlap    how an output's memory relates to an input's
 *   iteration  N strided tensors broadcast to one shape, walked in spans:
 *              size-1 dimensions dropped, dimensions that are contiguous for
 *              every operand merged, a flag for the contiguous fast path,
 *              and optionally spans of bounded length (chunks)
 *
 * Nothing here is part of the binary ABI: the functions are static inline
 * and compiled into the plugin. C99 (also valid C++), standard headers only,
 * no allocation, no global or static data.
 *
 * Helpers that can fail return a maxdev_status:
 *   MAXDEV_OK        done;
 *   MAXDEV_ERROR     the arguments are wrong (e.g. shapes that do not
 *                    broadcast); the message is in `error`;
 *   MAXDEV_DECLINED  the case is beyond the helper (e.g. too many
 *                    dimensions, a complex dtype); `error` says why. A kernel
 *                    declines too, and PyTorch's kernel serves the call.
 * `error` is a buffer of MAXDEV_ERROR_SIZE chars, or NULL. A kernel passes
 * the outcome on with maxdev_report():
 *
 *   char error[MAXDEV_ERROR_SIZE];
 *   maxdev_status st = maxdev_iter_init(&it, ..., error);
 *   if (st != MAXDEV_OK) return maxdev_report(call, st, error);
 */
#ifndef MAX_DEVICE_SDK_H_
#define MAX_DEVICE_SDK_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "max_device/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size of the `error` buffers the helpers write their messages to. */
#define MAXDEV_ERROR_SIZE 256

/* Return `status` from a kernel: for MAXDEV_ERROR, `error` (the helper's
 * message) is recorded with the host's set_error first. */
static inline maxdev_status maxdev_report(const maxdev_call* call, maxdev_status status,
                                          const char* error) {
  if (status == MAXDEV_ERROR && call->host->set_error != NULL)
    return call->host->set_error(call->ctx, error != NULL ? error : "max_device SDK helper failed");
  return status;
}

/* Write a message to `error` (may be NULL) and return `status`. */
#define MAXDEV_SDK_FAIL_(status, error, ...)                           \
  ((error) != NULL ? (void)snprintf((error), MAXDEV_ERROR_SIZE, __VA_ARGS__) \
                   : (void)0,                                           \
   (status))

/* ---------------------------------------------------------------------------
 * Dtypes
 * ------------------------------------------------------------------------- */

/* Bytes per element of `dtype` (bits times lanes, rounded up). */
static inline int64_t maxdev_dtype_size(maxdev_dtype dtype) {
  return ((int64_t)dtype.bits * dtype.lanes + 7) / 8;
}

/* The MAXDEV_DTYPE_* bit of `dtype`, or 0 for a dtype without one. A C
 * kernel dispatches on it:
 *
 *   switch (maxdev_dtype_bit(x->dtype)) {
 *     case MAXDEV_DTYPE_FLOAT32: ...; break;
 *     case MAXDEV_DTYPE_BFLOAT16: ...; break;
 *     default: return MAXDEV_DECLINED;
 *   }
 */
static inline uint64_t maxdev_dtype_bit(maxdev_dtype dtype) {
  if (dtype.lanes != 1) return 0;
  switch (dtype.code) {
    case MAXDEV_TYPE_BOOL: return dtype.bits == 8 ? MAXDEV_DTYPE_BOOL : 0;
    case MAXDEV_TYPE_UINT: return dtype.bits == 8 ? MAXDEV_DTYPE_UINT8 : 0;
    case MAXDEV_TYPE_INT:
      switch (dtype.bits) {
        case 8: return MAXDEV_DTYPE_INT8;
        case 16: return MAXDEV_DTYPE_INT16;
        case 32: return MAXDEV_DTYPE_INT32;
        case 64: return MAXDEV_DTYPE_INT64;
        default: return 0;
      }
    case MAXDEV_TYPE_FLOAT:
      switch (dtype.bits) {
        case 16: return MAXDEV_DTYPE_FLOAT16;
        case 32: return MAXDEV_DTYPE_FLOAT32;
        case 64: return MAXDEV_DTYPE_FLOAT64;
        default: return 0;
      }
    case MAXDEV_TYPE_BFLOAT: return dtype.bits == 16 ? MAXDEV_DTYPE_BFLOAT16 : 0;
    case MAXDEV_TYPE_COMPLEX:
      return dtype.bits == 64 ? MAXDEV_DTYPE_COMPLEX64 : dtype.bits == 128 ? MAXDEV_DTYPE_COMPLEX128 : 0;
    default: return 0;
  }
}

/* The dtype of one MAXDEV_DTYPE_* bit (e.g. for alloc_output); all fields
 * 0 for anything else. */
static inline maxdev_dtype maxdev_dtype_of_bit(uint64_t bit) {
  maxdev_dtype d;
  d.code = 0;
  d.bits = 0;
  d.lanes = 1;
  switch (bit) {
    case MAXDEV_DTYPE_BOOL: d.code = MAXDEV_TYPE_BOOL; d.bits = 8; break;
    case MAXDEV_DTYPE_UINT8: d.code = MAXDEV_TYPE_UINT; d.bits = 8; break;
    case MAXDEV_DTYPE_INT8: d.code = MAXDEV_TYPE_INT; d.bits = 8; break;
    case MAXDEV_DTYPE_INT16: d.code = MAXDEV_TYPE_INT; d.bits = 16; break;
    case MAXDEV_DTYPE_INT32: d.code = MAXDEV_TYPE_INT; d.bits = 32; break;
    case MAXDEV_DTYPE_INT64: d.code = MAXDEV_TYPE_INT; d.bits = 64; break;
    case MAXDEV_DTYPE_FLOAT16: d.code = MAXDEV_TYPE_FLOAT; d.bits = 16; break;
    case MAXDEV_DTYPE_BFLOAT16: d.code = MAXDEV_TYPE_BFLOAT; d.bits = 16; break;
    case MAXDEV_DTYPE_FLOAT32: d.code = MAXDEV_TYPE_FLOAT; d.bits = 32; break;
    case MAXDEV_DTYPE_FLOAT64: d.code = MAXDEV_TYPE_FLOAT; d.bits = 64; break;
    case MAXDEV_DTYPE_COMPLEX64: d.code = MAXDEV_TYPE_COMPLEX; d.bits = 64; break;
    case MAXDEV_DTYPE_COMPLEX128: d.code = MAXDEV_TYPE_COMPLEX; d.bits = 128; break;
    default: d.lanes = 0; break;
  }
  return d;
}

/* PyTorch's name of `dtype` ("float32", "bfloat16", "bool", ...; also
 * "uint16", "uint32", "uint64"), or NULL for a dtype PyTorch lacks. */
static inline const char* maxdev_dtype_name(maxdev_dtype dtype) {
  switch (maxdev_dtype_bit(dtype)) {
    case MAXDEV_DTYPE_BOOL: return "bool";
    case MAXDEV_DTYPE_UINT8: return "uint8";
    case MAXDEV_DTYPE_INT8: return "int8";
    case MAXDEV_DTYPE_INT16: return "int16";
    case MAXDEV_DTYPE_INT32: return "int32";
    case MAXDEV_DTYPE_INT64: return "int64";
    case MAXDEV_DTYPE_FLOAT16: return "float16";
    case MAXDEV_DTYPE_BFLOAT16: return "bfloat16";
    case MAXDEV_DTYPE_FLOAT32: return "float32";
    case MAXDEV_DTYPE_FLOAT64: return "float64";
    case MAXDEV_DTYPE_COMPLEX64: return "complex64";
    case MAXDEV_DTYPE_COMPLEX128: return "complex128";
    default: break;
  }
  if (dtype.code == MAXDEV_TYPE_UINT && dtype.lanes == 1) {
    switch (dtype.bits) {
      case 16: return "uint16";
      case 32: return "uint32";
      case 64: return "uint64";
      default: break;
    }
  }
  return NULL;
}

/* float16 (IEEE binary16, as stored) to float; exact. */
static inline float maxdev_float16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  int32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu, x;
  float f;
  if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    x = sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
  } else if (mant == 0) {
    x = sign;
  } else { /* subnormal: normalize */
    exp = -14;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    x = sign | ((uint32_t)(exp + 127) << 23) | ((mant & 0x3ffu) << 13);
  }
  memcpy(&f, &x, 4);
  return f;
}

/* float to float16, rounding to nearest even (overflow: infinity; NaN stays
 * NaN), as PyTorch converts. */
static inline uint16_t maxdev_float_to_float16(float f) {
  uint32_t x, mant, h, rem;
  int32_t exp, e;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  mant = x & 0x7fffffu;
  exp = (int32_t)((x >> 23) & 0xffu);
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant != 0 ? 0x200u : 0u));
  e = exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* a subnormal float16, or zero */
    uint32_t shift, halfway;
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    shift = (uint32_t)(14 - e);
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
  h = sign | ((uint32_t)e << 10) | (mant >> 13);
  rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; /* a carry rounds up to the next power (or inf) */
  return (uint16_t)h;
}

/* bfloat16 (as stored) to float; exact. */
static inline float maxdev_bfloat16_to_float(uint16_t b) {
  const uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* float to bfloat16, rounding to nearest even (NaN stays a quiet NaN), as
 * PyTorch converts. */
static inline uint16_t maxdev_float_to_bfloat16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------------------
 * Scalars: the value of a one-element tensor of any real dtype or bool —
 * a 0-dim CPU tensor such as the wrapped number of `x * 2.5`, or a device
 * tensor. Complex and unknown dtypes are declined; more than one element is
 * an error.
 * ------------------------------------------------------------------------- */

/* Reads t's one element into *as_int (integer and bool dtypes, and uint64
 * up to INT64_MAX) or *as_double (floating dtypes); *is_int says which. */
static inline maxdev_status maxdev_scalar_read_(const maxdev_tensor* t, int* is_int, int64_t* as_int,
                                                double* as_double, char* error) {
  const void* p = maxdev_tensor_data(t);
  const int64_t n = maxdev_tensor_numel(t);
  if (n != 1)
    return MAXDEV_SDK_FAIL_(MAXDEV_ERROR, error, "expected a one-element tensor, got %lld elements",
                            (long long)n);
  *is_int = 1;
  switch (maxdev_dtype_bit(t->dtype)) {
    case MAXDEV_DTYPE_BOOL: *as_int = *(const uint8_t*)p != 0; return MAXDEV_OK;
    case MAXDEV_DTYPE_UINT8: *as_int = *(const uint8_t*)p; return MAXDEV_OK;
    case MAXDEV_DTYPE_INT8: *as_int = *(const int8_t*)p; return MAXDEV_OK;
    case MAXDEV_DTYPE_INT16: *as_int = *(const int16_t*)p; return MAXDEV_OK;
    case MAXDEV_DTYPE_INT32: *as_int = *(const int32_t*)p; return MAXDEV_OK;
    case MAXDEV_DTYPE_INT64: *as_int = *(const int64_t*)p; return MAXDEV_OK;
    default: break;
  }
  *is_int = 0;
  switch (maxdev_dtype_bit(t->dtype)) {
    case MAXDEV_DTYPE_FLOAT16: *as_double = maxdev_float16_to_float(*(const uint16_t*)p); return MAXDEV_OK;
    case MAXDEV_DTYPE_BFLOAT16: *as_double = maxdev_bfloat16_to_float(*(const uint16_t*)p); return MAXDEV_OK;
    case MAXDEV_DTYPE_FLOAT32: *as_double = *(const float*)p; return MAXDEV_OK;
    case MAXDEV_DTYPE_FLOAT64: *as_double = *(const double*)p; return MAXDEV_OK;
    default: break;
  }
  if (t->dtype.code == MAXDEV_TYPE_UINT && t->dtype.lanes == 1 &&
      (t->dtype.bits == 16 || t->dtype.bits == 32 || t->dtype.bits == 64)) {
    uint64_t u = t->dtype.bits == 16 ? *(const uint16_t*)p
                 : t->dtype.bits == 32 ? *(const uint32_t*)p : *(const uint64_t*)p;
    if (u <= (uint64_t)INT64_MAX) {
      *is_int = 1;
      *as_int = (int64_t)u;
    } else {
      *as_double = (double)u;
    }
    return MAXDEV_OK;
  }
  return MAXDEV_SDK_FAIL_(MAXDEV_DECLINED, error, "a scalar of dtype %s is not read as a real number",
                          maxdev_dtype_name(t->dtype) != NULL ? maxdev_dtype_name(t->dtype) : "(unknown)");
}

/* The value of one-element tensor t as a double (an int64 beyond 2^53
 * rounds, as in PyTorch). */
static inline maxdev_status maxdev_scalar_to_double(const maxdev_tensor* t, double* out, char* error) {
  int is_int = 0;
  int64_t i = 0;
  double d = 0.0;
  const maxdev_status st = maxdev_scalar_read_(t, &is_int, &i, &d, error);
  if (st == MAXDEV_OK) *out = is_int ? (double)i : d;
  return st;
}

/* The value of one-element tensor t as an int64, exactly for integer
 * dtypes; a floating value is truncated toward zero, and one that is NaN,
 * infinite or out of int64's range is an error. */
static inline maxdev_status maxdev_scalar_to_int64(const maxdev_tensor* t, int64_t* out, char* error) {
  int is_int = 0;
  int64_t i = 0;
  double d = 0.0;
  const maxdev_status st = maxdev_scalar_read_(t, &is_int, &i, &d, error);
  if (st != MAXDEV_OK) return st;
  if (is_int) {
    *out = i;
  } else if (d == d && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
    *out = (int64_t)d;
  } else {
    return MAXDEV_SDK_FAIL_(MAXDEV_ERROR, error, "scalar value %g cannot be converted to int64", d);
  }
  return MAXDEV_OK;
}

/* ---------------------------------------------------------------------------
 * Overlap: how an output's memory relates to an input's, as PyTorch judges
 * out= and in-place arguments: disjoint, the very same elements (in place:
 * fine for element-wise code), or a partial overlap, which PyTorch refuses
 * ("some elements of the input tensor and the written-to tensor refer to a
 * single memory location").
 * ------------------------------------------------------------------------- */

#define MAXDEV_OVERLAP_NONE 0
#define MAXDEV_OVERLAP_SAME 1
#define MAXDEV_OVERLAP_PARTIAL 2

/* First and one-past-last byte t's elements reach (empty: lo == hi). */
static inline void maxdev_tensor_extent_(const maxdev_tensor* t, const char** lo, const char** hi) {
  int64_t low = 0, high = 0;
  const int64_t item = maxdev_dtype_size(t->dtype);
  const char* first = (const char*)maxdev_tensor_data(t);
  if (maxdev_tensor_numel(t) == 0) {
    *lo = *hi = first;
    return;
  }
  for (int32_t d = 0; d < t->ndim; ++d) {
    const int64_t span = (t->shape[d] - 1) * t->strides[d];
    if (span < 0) low += span; else high += span;
  }
  *lo = first + low * item;
  *hi = first + (high + 1) * item;
}

/* MAXDEV_OVERLAP_NONE, _SAME or _PARTIAL for tensors a and b. */
static inline int maxdev_tensor_overlap(const maxdev_tensor* a, const maxdev_tensor* b) {
  const char *alo, *ahi, *blo, *bhi;
  maxdev_tensor_extent_(a, &alo, &ahi);
  maxdev_tensor_extent_(b, &blo, &bhi);
  if (alo == ahi || blo == bhi || ahi <= blo || bhi <= alo) return MAXDEV_OVERLAP_NONE;
  if (maxdev_tensor_data(a) != maxdev_tensor_data(b) || a->ndim != b->ndim ||
      a->dtype.bits != b->dtype.bits)
    return MAXDEV_OVERLAP_PARTIAL;
  for (int32_t d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d]))
      return MAXDEV_OVERLAP_PARTIAL;
  }
  return MAXDEV_OVERLAP_SAME;
}

/* ---------------------------------------------------------------------------
 * Broadcasting iteration over N strided tensors (a small TensorIterator).
 *
 *   const maxdev_tensor* ops[3] = {out, a, b};   (the output first, by habit)
 *   maxdev_iter it;
 *   maxdev_span s;
 *   char error[MAXDEV_ERROR_SIZE];
 *   maxdev_status st = maxdev_iter_init(&it, out->ndim, out->shape, 3, ops, error);
 *   if (st != MAXDEV_OK) return maxdev_report(call, st, error);
 *   while (maxdev_iter_next(&it, &s)) {
 *     if (s.contiguous) {               (every operand dense: vectorizable)
 *       float* o = (float*)s.ptr[0];
 *       const float *x = (const float*)s.ptr[1], *y = (const float*)s.ptr[2];
 *       for (int64_t i = 0; i < s.n; ++i) o[i] = x[i] + y[i];
 *     } else {
 *       for (int64_t i = 0; i < s.n; ++i)
 *         MAXDEV_SPAN_AT(s, 0, float, i) =
 *             MAXDEV_SPAN_AT(s, 1, float, i) + MAXDEV_SPAN_AT(s, 2, float, i);
 *     }
 *   }
 *
 * Any strides (negative, 0 for expanded tensors), any byte offset, operands
 * of different dtypes. A contiguous problem is one span.
 * ------------------------------------------------------------------------- */

/* Most operands one iterator walks. */
#define MAXDEV_ITER_MAX_OPERANDS 8
/* Most dimensions an iteration keeps after dropping size-1 dimensions and
 * merging contiguous ones (more: MAXDEV_DECLINED). */
#define MAXDEV_ITER_MAX_DIMS 25

/* One run of elements: n elements of every operand, operand k's at
 * ptr[k] + i * step[k] for i in [0, n). Entries past the iterator's
 * num_operands are unspecified. */
typedef struct maxdev_span {
  int64_t n;                               /* elements in the span, >= 1 */
  char* ptr[MAXDEV_ITER_MAX_OPERANDS];     /* operand k's first element of the span */
  int64_t step[MAXDEV_ITER_MAX_OPERANDS];  /* bytes from one element of operand k to the next; 0 where
                                              it is broadcast, negative for flipped dimensions */
  int32_t contiguous;                      /* 1 when every operand's step is its element size (the
                                              fast path: index ptr[k] as a plain array) */
} maxdev_span;

/* Element i of span s's operand k, as an lvalue of `type`. */
#define MAXDEV_SPAN_AT(s, k, type, i) (*(type*)((s).ptr[k] + (int64_t)(i) * (s).step[k]))

/* An iteration over a shape. Set up by maxdev_iter_init or
 * maxdev_iter_init_strided, walked by maxdev_iter_next. Plain data: copy it
 * to walk the same iteration twice. */
typedef struct maxdev_iter {
  int32_t num_operands;  /* operands walked together */
  int32_t ndim;          /* dimensions after coalescing, >= 1 (a 0-dim shape is one element) */
  int64_t numel;         /* elements of the iteration shape; 0: maxdev_iter_next finds none */
  int64_t max_span;      /* longest span maxdev_iter_next hands out; 0 (set by init): a whole
                            row of the innermost dimension. Set it for chunks, e.g. to convert
                            bfloat16 through a float buffer of that many elements. */
  int64_t shape[MAXDEV_ITER_MAX_DIMS];  /* coalesced sizes, outermost first */
  int64_t strides[MAXDEV_ITER_MAX_DIMS][MAXDEV_ITER_MAX_OPERANDS]; /* [d][k]: operand k's stride
                                           along coalesced dimension d, in bytes */
  int64_t item_size[MAXDEV_ITER_MAX_OPERANDS]; /* bytes per element of operand k */
  char* base[MAXDEV_ITER_MAX_OPERANDS]; /* operand k's element at index 0 */
  /* The walk's position (maxdev_iter_next advances it). */
  char* row[MAXDEV_ITER_MAX_OPERANDS];  /* operand k's start of the current innermost row */
  int64_t index[MAXDEV_ITER_MAX_DIMS];  /* index of the next span's first element */
  int32_t done;                         /* 1 when the walk is over */
} maxdev_iter;

/* (Re)starts the walk at index 0; with `base` (num_operands pointers), from
 * those start pointers instead, with the same shape and strides — so one
 * set-up iteration walks many blocks (e.g. the reduced dimensions below
 * each output element of a reduction). */
static inline void maxdev_iter_restart(maxdev_iter* it, char* const* base) {
  for (int32_t k = 0; k < it->num_operands; ++k) {
    if (base != NULL) it->base[k] = base[k];
    it->row[k] = it->base[k];
  }
  for (int32_t d = 0; d < it->ndim; ++d) it->index[d] = 0;
  it->done = it->numel == 0;
}

static inline maxdev_status maxdev_iter_begin_(maxdev_iter* it, int32_t num_operands, char* error) {
  if (num_operands < 1 || num_operands > MAXDEV_ITER_MAX_OPERANDS)
    return MAXDEV_SDK_FAIL_(num_operands < 1 ? MAXDEV_ERROR : MAXDEV_DECLINED, error,
                            "an iteration takes 1 to %d operands, not %d", MAXDEV_ITER_MAX_OPERANDS,
                            (int)num_operands);
  it->num_operands = num_operands;
  it->ndim = 0;
  it->numel = 1;
  it->max_span = 0;
  return MAXDEV_OK;
}

/* Appends a dimension (outer to inner) of `size` with the operands' byte
 * strides: size-1 dimensions are dropped, and a dimension every operand
 * steps over exactly once per step of the previous one is merged into it. */
static inline maxdev_status maxdev_iter_add_dim_(maxdev_iter* it, int64_t size, const int64_t* strides,
                                                 char* error) {
  int32_t k;
  it->numel *= size;
  if (size == 1) return MAXDEV_OK;
  if (it->ndim > 0) {
    const int32_t last = it->ndim - 1;
    int mergeable = 1;
    for (k = 0; k < it->num_operands; ++k)
      mergeable = mergeable && it->strides[last][k] == strides[k] * size;
    if (mergeable) {
      it->shape[last] *= size;
      for (k = 0; k < it->num_operands; ++k) it->strides[last][k] = strides[k];
      return MAXDEV_OK;
    }
  }
  if (it->ndim == MAXDEV_ITER_MAX_DIMS)
    return MAXDEV_SDK_FAIL_(MAXDEV_DECLINED, error,
                            "more than %d dimensions are left after merging contiguous ones",
                            MAXDEV_ITER_MAX_DIMS);
  it->shape[it->ndim] = size;
  for (k = 0; k < it->num_operands; ++k) it->strides[it->ndim][k] = strides[k];
  ++it->ndim;
  return MAXDEV_OK;
}

static inline void maxdev_iter_end_(maxdev_iter* it) {
  if (it->ndim == 0) { /* every dimension had size 1: one element */
    it->ndim = 1;
    it->shape[0] = 1;
    for (int32_t k = 0; k < it->num_operands; ++k) it->strides[0][k] = 0;
  }
  maxdev_iter_restart(it, NULL);
}

/* Sets up `it` to walk (ndim, shape) over `num_operands` tensors that
 * broadcast to it (PyTorch's rules: aligned from the last dimension; a
 * missing or size-1 dimension repeats). An operand that does not broadcast
 * is MAXDEV_ERROR; more than MAXDEV_ITER_MAX_OPERANDS operands or
 * dimensions, MAXDEV_DECLINED. */
static inline maxdev_status maxdev_iter_init(maxdev_iter* it, int32_t ndim, const int64_t* shape,
                                             int32_t num_operands, const maxdev_tensor* const* operands,
                                             char* error) {
  int64_t strides[MAXDEV_ITER_MAX_OPERANDS];
  maxdev_status st = maxdev_iter_begin_(it, num_operands, error);
  int32_t k, d;
  if (st != MAXDEV_OK) return st;
  for (k = 0; k < num_operands; ++k) {
    const maxdev_tensor* t = operands[k];
    if (t->ndim > ndim)
      return MAXDEV_SDK_FAIL_(MAXDEV_ERROR, error,
                              "operand %d has %d dimensions, more than the %d of the iteration shape",
                              (int)k, (int)t->ndim, (int)ndim);
    it->item_size[k] = maxdev_dtype_size(t->dtype);
    it->base[k] = (char*)maxdev_tensor_data(t);
  }
  for (d = 0; d < ndim; ++d) {
    for (k = 0; k < num_operands; ++k) {
      const maxdev_tensor* t = operands[k];
      const int32_t td = d - (ndim - t->ndim);
      const int64_t size = td >= 0 ? t->shape[td] : 1;
      if (size != shape[d] && size != 1)
        return MAXDEV_SDK_FAIL_(MAXDEV_ERROR, error,
                                "operand %d of size %lld in dimension %d does not broadcast to %lld", (int)k,
                                (long long)size, (int)d, (long long)shape[d]);
      strides[k] = size == 1 ? 0 : t->strides[td] * it->item_size[k];
    }
    st = maxdev_iter_add_dim_(it, shape[d], strides, error);
    if (st != MAXDEV_OK) return st;
  }
  maxdev_iter_end_(it);
  return MAXDEV_OK;
}

/* Sets up `it` from explicit layouts: operand k starts at base[k], has
 * elements of item_size[k] bytes, and steps strides[k * ndim + d] bytes
 * along dimension d of (ndim, shape). For views a kernel makes up itself
 * (e.g. all dimensions but a softmax's, or a reduction's reduced ones). */
static inline maxdev_status maxdev_iter_init_strided(maxdev_iter* it, int32_t ndim, const int64_t* shape,
                                                     int32_t num_operands, char* const* base,
                                                     const int64_t* strides, const int64_t* item_size,
                                                     char* error) {
  int64_t dim_strides[MAXDEV_ITER_MAX_OPERANDS];
  maxdev_status st = maxdev_iter_begin_(it, num_operands, error);
  int32_t k, d;
  if (st != MAXDEV_OK) return st;
  for (k = 0; k < num_operands; ++k) {
    it->item_size[k] = item_size[k];
    it->base[k] = base[k];
  }
  for (d = 0; d < ndim; ++d) {
    for (k = 0; k < num_operands; ++k) dim_strides[k] = strides[k * ndim + d];
    st = maxdev_iter_add_dim_(it, shape[d], dim_strides, error);
    if (st != MAXDEV_OK) return st;
  }
  maxdev_iter_end_(it);
  return MAXDEV_OK;
}

/* Fills *span with the next run of elements and returns 1, or returns 0
 * when the walk is over. Spans follow the row-major order of the iteration
 * shape. */
static inline int maxdev_iter_next(maxdev_iter* it, maxdev_span* span) {
  const int32_t inner = it->ndim - 1;
  const int64_t at = it->index[inner];
  int64_t n;
  int32_t k, d;
  if (it->done) return 0;
  n = it->shape[inner] - at;
  if (it->max_span > 0 && n > it->max_span) n = it->max_span;
  span->n = n;
  span->contiguous = 1;
  for (k = 0; k < it->num_operands; ++k) {
    span->step[k] = it->strides[inner][k];
    span->ptr[k] = it->row[k] + at * span->step[k];
    if (span->step[k] != it->item_size[k]) span->contiguous = 0;
  }
  it->index[inner] = at + n;
  if (it->index[inner] < it->shape[inner]) return 1;
  it->index[inner] = 0;
  for (d = inner - 1; d >= 0; --d) { /* odometer over the outer dimensions */
    for (k = 0; k < it->num_operands; ++k) it->row[k] += it->strides[d][k];
    if (++it->index[d] < it->shape[d]) return 1;
    for (k = 0; k < it->num_operands; ++k) it->row[k] -= it->strides[d][k] * it->shape[d];
    it->index[d] = 0;
  }
  it->done = 1;
  return 1;
}

/* The broadcast shape of `num` tensors (PyTorch's rules) into shape[0..*ndim),
 * `capacity` entries at most (more: MAXDEV_DECLINED). Shapes that do not
 * broadcast are MAXDEV_ERROR. */
static inline maxdev_status maxdev_broadcast_shape(int32_t num, const maxdev_tensor* const* tensors,
                                                   int32_t capacity, int64_t* shape, int32_t* ndim,
                                                   char* error) {
  int32_t n = 0, i, d;
  for (i = 0; i < num; ++i)
    if (tensors[i]->ndim > n) n = tensors[i]->ndim;
  if (n > capacity)
    return MAXDEV_SDK_FAIL_(MAXDEV_DECLINED, error, "%d dimensions do not fit in %d", (int)n,
                            (int)capacity);
  for (d = 0; d < n; ++d) shape[d] = 1;
  for (i = 0; i < num; ++i) {
    const maxdev_tensor* t = tensors[i];
    for (d = 0; d < t->ndim; ++d) {
      int64_t* out = &shape[n - t->ndim + d];
      if (t->shape[d] == *out || t->shape[d] == 1) continue;
      if (*out != 1)
        return MAXDEV_SDK_FAIL_(MAXDEV_ERROR, error, "shapes do not broadcast: size %lld against %lld",
                                (long long)t->shape[d], (long long)*out);
      *out = t->shape[d];
    }
  }
  *ndim = n;
  return MAXDEV_OK;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MAX_DEVICE_SDK_H_ */
