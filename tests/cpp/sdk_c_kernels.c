/* See sdk_c_kernels.h. Built as C99 with -pedantic -Werror: the C SDK
 * must stay plain C. */
#include "sdk_c_kernels.h"

maxdev_status c_record_spans(int32_t ndim, const int64_t* shape, int32_t num_operands,
                             const maxdev_tensor* const* operands, int64_t max_span, c_span_record* spans,
                             int32_t capacity, int32_t* num_spans, char* error) {
  maxdev_iter it;
  maxdev_span s;
  int32_t k;
  const maxdev_status st = maxdev_iter_init(&it, ndim, shape, num_operands, operands, error);
  *num_spans = 0;
  if (st != MAXDEV_OK) return st;
  it.max_span = max_span;
  while (maxdev_iter_next(&it, &s)) {
    if (*num_spans < capacity) {
      c_span_record* r = &spans[*num_spans];
      r->n = s.n;
      r->contiguous = s.contiguous;
      for (k = 0; k < num_operands; ++k) {
        r->offset[k] = s.ptr[k] - (char*)maxdev_tensor_data(operands[k]);
        r->step[k] = s.step[k];
      }
    }
    ++*num_spans;
  }
  return MAXDEV_OK;
}

/* A 0-dim float64 view of a value, for a CPU scalar operand. */
typedef struct scalar_operand {
  double value;
  maxdev_tensor view;
} scalar_operand;

static const maxdev_tensor* as_operand(const maxdev_tensor* t, scalar_operand* scalar, maxdev_status* st,
                                       char* error) {
  if (t->device.device_type != MAXDEV_DEVICE_CPU) return t;
  *st = maxdev_scalar_to_double(t, &scalar->value, error);
  memset(&scalar->view, 0, sizeof(scalar->view));
  scalar->view.data = &scalar->value;
  scalar->view.device.device_type = MAXDEV_DEVICE_CPU;
  scalar->view.dtype = maxdev_dtype_of_bit(MAXDEV_DTYPE_FLOAT64);
  return &scalar->view;
}

#define ADD_LOOP(T, O, X, Y)                                                    \
  while (maxdev_iter_next(&it, &s)) {                                           \
    if (s.contiguous) {                                                         \
      T* o = (T*)s.ptr[0];                                                      \
      const T* x = (const T*)s.ptr[1];                                          \
      const T* y = (const T*)s.ptr[2];                                          \
      for (i = 0; i < s.n; ++i) o[i] = (T)(x[i] + alpha * y[i]);                \
    } else {                                                                    \
      for (i = 0; i < s.n; ++i)                                                 \
        MAXDEV_SPAN_AT(s, 0, O, i) =                                            \
            (O)(MAXDEV_SPAN_AT(s, 1, X, i) + alpha * MAXDEV_SPAN_AT(s, 2, Y, i)); \
    }                                                                           \
  }

maxdev_status c_add_out(const maxdev_call* call) {
  char error[MAXDEV_ERROR_SIZE];
  const maxdev_tensor* self = call->args[0].u.tensor;
  const maxdev_tensor* out = call->outputs[0];
  const maxdev_tensor* ops[3];
  scalar_operand scalar;
  maxdev_status st = MAXDEV_OK;
  maxdev_iter it;
  maxdev_span s;
  int64_t i;
  const double alpha = maxdev_value_as_double(&call->args[2]);
  ops[0] = out;
  ops[1] = self;
  ops[2] = as_operand(call->args[1].u.tensor, &scalar, &st, error);
  if (st != MAXDEV_OK) return maxdev_report(call, st, error);
  if (maxdev_tensor_overlap(out, self) == MAXDEV_OVERLAP_PARTIAL ||
      maxdev_tensor_overlap(out, ops[2]) == MAXDEV_OVERLAP_PARTIAL)
    return MAXDEV_DECLINED;
  st = maxdev_iter_init(&it, out->ndim, out->shape, 3, ops, error);
  if (st != MAXDEV_OK) return maxdev_report(call, st, error);
  if (ops[2] == &scalar.view) { /* mixed dtypes: the strided loop reads the double scalar */
    switch (maxdev_dtype_bit(out->dtype)) {
      case MAXDEV_DTYPE_FLOAT32:
        while (maxdev_iter_next(&it, &s))
          for (i = 0; i < s.n; ++i)
            MAXDEV_SPAN_AT(s, 0, float, i) =
                (float)(MAXDEV_SPAN_AT(s, 1, float, i) + alpha * MAXDEV_SPAN_AT(s, 2, double, i));
        return MAXDEV_OK;
      case MAXDEV_DTYPE_FLOAT64:
        ADD_LOOP(double, double, double, double)
        return MAXDEV_OK;
      default: return MAXDEV_DECLINED;
    }
  }
  if (self->dtype.bits != out->dtype.bits || ops[2]->dtype.bits != out->dtype.bits) return MAXDEV_DECLINED;
  switch (maxdev_dtype_bit(out->dtype)) {
    case MAXDEV_DTYPE_FLOAT32: ADD_LOOP(float, float, float, float) return MAXDEV_OK;
    case MAXDEV_DTYPE_FLOAT64: ADD_LOOP(double, double, double, double) return MAXDEV_OK;
    default: return MAXDEV_DECLINED;
  }
}

maxdev_status c_bfloat16_to_float32(const maxdev_tensor* out, const maxdev_tensor* in, int64_t chunk,
                                    char* error) {
  float buffer[64];
  const maxdev_tensor* ops[2];
  maxdev_iter it;
  maxdev_span s;
  int64_t i;
  maxdev_status st;
  if (chunk < 1 || chunk > 64) return MAXDEV_DECLINED;
  ops[0] = out;
  ops[1] = in;
  st = maxdev_iter_init(&it, out->ndim, out->shape, 2, ops, error);
  if (st != MAXDEV_OK) return st;
  it.max_span = chunk;
  while (maxdev_iter_next(&it, &s)) {
    if (s.n > chunk) return MAXDEV_ERROR; /* the chunking broke its promise */
    for (i = 0; i < s.n; ++i) buffer[i] = maxdev_bfloat16_to_float(MAXDEV_SPAN_AT(s, 1, uint16_t, i));
    for (i = 0; i < s.n; ++i) MAXDEV_SPAN_AT(s, 0, float, i) = buffer[i];
  }
  return MAXDEV_OK;
}

maxdev_status c_row_sums(const maxdev_tensor* in, double* sums, char* error) {
  maxdev_iter rows, cols;
  maxdev_span r, c;
  const int64_t item = maxdev_dtype_size(in->dtype);
  const int64_t row_strides[1] = {in->strides[0] * item};
  const int64_t col_strides[1] = {in->strides[1] * item};
  char* base[1];
  int64_t i, j, row = 0;
  maxdev_status st;
  base[0] = (char*)maxdev_tensor_data(in);
  st = maxdev_iter_init_strided(&rows, 1, &in->shape[0], 1, base, row_strides, &item, error);
  if (st == MAXDEV_OK) st = maxdev_iter_init_strided(&cols, 1, &in->shape[1], 1, base, col_strides, &item, error);
  if (st != MAXDEV_OK) return st;
  while (maxdev_iter_next(&rows, &r)) {
    for (i = 0; i < r.n; ++i, ++row) {
      char* start[1];
      start[0] = r.ptr[0] + i * r.step[0];
      maxdev_iter_restart(&cols, start);
      sums[row] = 0.0;
      while (maxdev_iter_next(&cols, &c))
        for (j = 0; j < c.n; ++j) sums[row] += MAXDEV_SPAN_AT(c, 0, float, j);
    }
  }
  return MAXDEV_OK;
}

int64_t c_dtype_size(maxdev_dtype dtype) { return maxdev_dtype_size(dtype); }
uint64_t c_dtype_bit(maxdev_dtype dtype) { return maxdev_dtype_bit(dtype); }
maxdev_dtype c_dtype_of_bit(uint64_t bit) { return maxdev_dtype_of_bit(bit); }
const char* c_dtype_name(maxdev_dtype dtype) { return maxdev_dtype_name(dtype); }
float c_float16_to_float(uint16_t h) { return maxdev_float16_to_float(h); }
uint16_t c_float_to_float16(float f) { return maxdev_float_to_float16(f); }
float c_bfloat16_to_float(uint16_t b) { return maxdev_bfloat16_to_float(b); }
uint16_t c_float_to_bfloat16(float f) { return maxdev_float_to_bfloat16(f); }
maxdev_status c_scalar_to_double(const maxdev_tensor* t, double* out, char* error) {
  return maxdev_scalar_to_double(t, out, error);
}
maxdev_status c_scalar_to_int64(const maxdev_tensor* t, int64_t* out, char* error) {
  return maxdev_scalar_to_int64(t, out, error);
}
int c_tensor_overlap(const maxdev_tensor* a, const maxdev_tensor* b) { return maxdev_tensor_overlap(a, b); }
maxdev_status c_broadcast_shape(int32_t num, const maxdev_tensor* const* tensors, int32_t capacity,
                                int64_t* shape, int32_t* ndim, char* error) {
  return maxdev_broadcast_shape(num, tensors, capacity, shape, ndim, error);
}
