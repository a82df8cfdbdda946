/* Kernels and walks written in C against the C SDK (max_device/sdk.h),
 * compiled as C99 (sdk_c_kernels.c) and driven by test_sdk_c.cpp. */
#ifndef MAXDEV_TESTS_SDK_C_KERNELS_H_
#define MAXDEV_TESTS_SDK_C_KERNELS_H_

#include <max_device/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What one span looked like. */
typedef struct c_span_record {
  int64_t n;
  int32_t contiguous;
  int64_t offset[MAXDEV_ITER_MAX_OPERANDS]; /* ptr[k] - base of operand k, bytes */
  int64_t step[MAXDEV_ITER_MAX_OPERANDS];
} c_span_record;

/* Walks (ndim, shape) over the operands with spans of at most max_span
 * elements; records up to `capacity` spans in `spans` and their count in
 * *num_spans. Returns maxdev_iter_init's status. */
maxdev_status c_record_spans(int32_t ndim, const int64_t* shape, int32_t num_operands,
                             const maxdev_tensor* const* operands, int64_t max_span, c_span_record* spans,
                             int32_t capacity, int32_t* num_spans, char* error);

/* aten::add.out-like kernel in C: out = self + alpha * other (float32 or
 * float64, broadcasting, any strides; a 0-dim CPU `other` of any real dtype
 * read as a scalar). Arguments (self, other, alpha, out). */
maxdev_status c_add_out(const maxdev_call* call);

/* out (float32, any strides) = bfloat16 `in` converted, through a float
 * buffer of `chunk` elements (spans bounded with max_span). */
maxdev_status c_bfloat16_to_float32(const maxdev_tensor* out, const maxdev_tensor* in, int64_t chunk,
                                    char* error);

/* Sum over the last dimension of a float32 [rows, cols] tensor of any
 * strides, one restarted inner iteration per row (the reduction pattern). */
maxdev_status c_row_sums(const maxdev_tensor* in, double* sums, char* error);

/* The C SDK's inline helpers, compiled as C. */
int64_t c_dtype_size(maxdev_dtype dtype);
uint64_t c_dtype_bit(maxdev_dtype dtype);
maxdev_dtype c_dtype_of_bit(uint64_t bit);
const char* c_dtype_name(maxdev_dtype dtype);
float c_float16_to_float(uint16_t h);
uint16_t c_float_to_float16(float f);
float c_bfloat16_to_float(uint16_t b);
uint16_t c_float_to_bfloat16(float f);
maxdev_status c_scalar_to_double(const maxdev_tensor* t, double* out, char* error);
maxdev_status c_scalar_to_int64(const maxdev_tensor* t, int64_t* out, char* error);
int c_tensor_overlap(const maxdev_tensor* a, const maxdev_tensor* b);
maxdev_status c_broadcast_shape(int32_t num, const maxdev_tensor* const* tensors, int32_t capacity,
                                int64_t* shape, int32_t* ndim, char* error);

#ifdef __cplusplus
}
#endif

#endif
