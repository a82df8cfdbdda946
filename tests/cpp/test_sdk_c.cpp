// Tests of the C SDK (plugin_api/include/max_device/sdk.h) through code
// compiled as C (sdk_c_kernels.c): strided iteration with broadcasting,
// scalars, overlap, dtypes. No loader, no torch.
#include "sdk_c_kernels.h"

#include <max_device/plugin.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A view over `data` with explicit shape, strides (elements) and offset.
struct View {
  std::vector<int64_t> shape, strides;
  maxdev_tensor t{};
  View(void* data, maxdev_dtype dtype, std::vector<int64_t> s, std::vector<int64_t> st, int64_t offset = 0,
       int32_t device = MAXDEV_DEVICE_MAX)
      : shape(std::move(s)), strides(std::move(st)) {
    t.data = data;
    t.dtype = dtype;
    t.byte_offset = static_cast<uint64_t>(offset * c_dtype_size(dtype));
    t.device.device_type = device;
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
  }
};

std::vector<c_span_record> spans(const std::vector<const maxdev_tensor*>& ops, int64_t max_span = 0,
                                 maxdev_status expect = MAXDEV_OK, std::string* error_out = nullptr) {
  std::vector<c_span_record> out(256);
  int32_t n = 0;
  char error[MAXDEV_ERROR_SIZE] = "";
  const maxdev_tensor* shape_of = ops[0];
  EXPECT_EQ(c_record_spans(shape_of->ndim, shape_of->shape, static_cast<int32_t>(ops.size()), ops.data(),
                           max_span, out.data(), static_cast<int32_t>(out.size()), &n, error),
            expect)
      << error;
  if (error_out != nullptr) *error_out = error;
  out.resize(static_cast<size_t>(std::min<int32_t>(n, 256)));
  return out;
}

TEST(SdkCIter, ContiguousOperandsAreOneContiguousSpan) {
  float a[24], b[24];
  View x(a, maxdev::kFloat32, {2, 3, 4}, {12, 4, 1}), y(b, maxdev::kFloat32, {2, 3, 4}, {12, 4, 1});
  const auto s = spans({&x.t, &y.t});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].n, 24);
  EXPECT_EQ(s[0].contiguous, 1);
  EXPECT_EQ(s[0].step[0], 4);
}

TEST(SdkCIter, BroadcastTransposedAndFlippedOperandsAreWalkedInRowMajorOrder) {
  float out[6], a[6], b[3];
  View o(out, maxdev::kFloat32, {2, 3}, {3, 1});
  View t(a, maxdev::kFloat32, {2, 3}, {1, 2});      // transposed 3x2
  View r(b, maxdev::kFloat32, {3}, {-1}, 2);         // a flipped row, broadcast over rows
  const auto s = spans({&o.t, &t.t, &r.t});
  ASSERT_EQ(s.size(), 2u);  // one span per row
  for (int row = 0; row < 2; ++row) {
    EXPECT_EQ(s[row].n, 3);
    EXPECT_EQ(s[row].contiguous, 0);
    EXPECT_EQ(s[row].offset[0], row * 3 * 4);
    EXPECT_EQ(s[row].offset[1], row * 4);
    EXPECT_EQ(s[row].offset[2], 0);
    EXPECT_EQ(s[row].step[1], 8);
    EXPECT_EQ(s[row].step[2], -4);
  }
}

TEST(SdkCIter, SizeOneDimensionsVanishAndMergeableOnesMerge) {
  double buf[64];
  // every other element of a [4, 16] buffer, as [4, 1, 2, 4]: one strided span
  View uniform(buf, maxdev::kFloat64, {4, 1, 2, 4}, {16, 99, 8, 2});
  auto s = spans({&uniform.t});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].n, 32);
  EXPECT_EQ(s[0].step[0], 16);
  EXPECT_EQ(s[0].contiguous, 0);
  // dense rows of 4 every 8 elements: the outer dimensions merge (8 rows)
  View rows(buf, maxdev::kFloat64, {4, 1, 2, 4}, {16, 99, 8, 1});
  s = spans({&rows.t});
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(s[1].offset[0], 8 * 8);
  EXPECT_EQ(s[7].offset[0], 7 * 8 * 8);
  EXPECT_EQ(s[1].contiguous, 1);
}

TEST(SdkCIter, ChunkedSpansNeverExceedMaxSpanAndCoverEveryElement) {
  float buf[10 * 7];
  View v(buf, maxdev::kFloat32, {10, 7}, {7, 1});
  const auto s = spans({&v.t}, 4);
  int64_t covered = 0;
  for (const auto& r : s) {
    EXPECT_LE(r.n, 4);
    EXPECT_EQ(r.offset[0], covered * 4);
    covered += r.n;
  }
  EXPECT_EQ(covered, 70);
  EXPECT_EQ(s.size(), 18u);  // 70 contiguous elements in chunks of 4
}

TEST(SdkCIter, EmptyShapesHaveNoSpansAndZeroDimHasOne) {
  float buf[1] = {};
  View empty(buf, maxdev::kFloat32, {3, 0}, {0, 1});
  EXPECT_TRUE(spans({&empty.t}).empty());
  View scalar(buf, maxdev::kFloat32, {}, {});
  const auto s = spans({&scalar.t});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].n, 1);
}

TEST(SdkCIter, OperandsThatDoNotBroadcastAreAnErrorTooManyDimsDeclined) {
  float buf[8];
  View out(buf, maxdev::kFloat32, {2, 4}, {4, 1}), bad(buf, maxdev::kFloat32, {3}, {1});
  std::string error;
  spans({&out.t, &bad.t}, 0, MAXDEV_ERROR, &error);
  EXPECT_EQ(error, "operand 1 of size 3 in dimension 1 does not broadcast to 4");
  View bigger(buf, maxdev::kFloat32, {1, 2, 4}, {8, 4, 1});
  spans({&out.t, &bigger.t}, 0, MAXDEV_ERROR, &error);
  EXPECT_NE(error.find("more than the 2 of the iteration shape"), std::string::npos);
  // 26 dimensions of size 2 that no merge can join (strides 3^k)
  std::vector<int64_t> shape(26, 2), strides(26);
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0; s *= 3) strides[d] = s;
  View deep(buf, maxdev::kFloat32, shape, strides);
  spans({&deep.t}, 0, MAXDEV_DECLINED, &error);
  EXPECT_NE(error.find("more than 25 dimensions"), std::string::npos);
}

TEST(SdkCIter, RestartWalksAnotherBlockWithTheSameLayout) {
  // rows of a transposed [3, 4] view: sums restart the column walk per row
  float buf[12];
  for (int i = 0; i < 12; ++i) buf[i] = static_cast<float>(i);
  View t(buf, maxdev::kFloat32, {3, 4}, {1, 3});  // t[i][j] = buf[j*3 + i]
  double sums[3] = {};
  char error[MAXDEV_ERROR_SIZE] = "";
  ASSERT_EQ(c_row_sums(&t.t, sums, error), MAXDEV_OK) << error;
  EXPECT_EQ(sums[0], 0 + 3 + 6 + 9);
  EXPECT_EQ(sums[1], 1 + 4 + 7 + 10);
  EXPECT_EQ(sums[2], 2 + 5 + 8 + 11);
}

TEST(SdkCIter, ChunkedBFloat16ConversionThroughASmallBuffer) {
  uint16_t in[3 * 5];
  float out[5 * 3] = {};
  for (int i = 0; i < 15; ++i) in[i] = c_float_to_bfloat16(static_cast<float>(i) - 7.0f);
  View src(in, maxdev::kBFloat16, {5, 3}, {1, 5});  // transposed
  View dst(out, maxdev::kFloat32, {5, 3}, {3, 1});
  char error[MAXDEV_ERROR_SIZE] = "";
  ASSERT_EQ(c_bfloat16_to_float32(&dst.t, &src.t, 2, error), MAXDEV_OK) << error;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[i * 3 + j], static_cast<float>(j * 5 + i) - 7.0f);
}

// --- A whole C kernel, through a host -------------------------------------

}  // namespace

struct maxdev_host_context {
  std::string error;
};

namespace {

maxdev_status record_error(maxdev_host_context* ctx, const char* message) {
  ctx->error = message;
  return MAXDEV_ERROR;
}

const maxdev_host_api kHost = {sizeof(maxdev_host_api), MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR, nullptr,
                               record_error, nullptr, nullptr};

maxdev_status run_add(const maxdev_tensor* self, const maxdev_tensor* other, double alpha, const maxdev_tensor* out,
                      std::string* error = nullptr) {
  maxdev_value args[4] = {};
  args[0].kind = MAXDEV_VALUE_TENSOR;
  args[0].u.tensor = self;
  args[1].kind = MAXDEV_VALUE_TENSOR;
  args[1].u.tensor = other;
  args[2].kind = MAXDEV_VALUE_FLOAT;
  args[2].u.f = alpha;
  args[3].kind = MAXDEV_VALUE_TENSOR;
  args[3].u.tensor = out;
  const maxdev_tensor* outputs[1] = {out};
  maxdev_host_context ctx;
  maxdev_call call{sizeof(maxdev_call), &kHost, &ctx, nullptr, args, 4, 1, outputs};
  const maxdev_status st = c_add_out(&call);
  if (error != nullptr) *error = ctx.error;
  return st;
}

TEST(SdkCKernel, AddBroadcastsFollowsStridesAndReadsCpuScalars) {
  double a[6] = {0, 1, 2, 3, 4, 5}, b[3] = {30, 20, 10}, o[6] = {};
  View self(a, maxdev::kFloat64, {2, 3}, {1, 2});  // transposed
  View other(b, maxdev::kFloat64, {3}, {-1}, 2);   // [10, 20, 30]
  View out(o, maxdev::kFloat64, {2, 3}, {3, 1});
  ASSERT_EQ(run_add(&self.t, &other.t, 1.0, &out.t), MAXDEV_OK);
  EXPECT_EQ(std::vector<double>(o, o + 6), (std::vector<double>{10, 22, 34, 11, 23, 35}));
  // in place on a contiguous float32 tensor, plus a 0-dim int64 CPU scalar
  float f[4] = {1, 2, 3, 4};
  int64_t three = 3;
  View x(f, maxdev::kFloat32, {4}, {1});
  View scalar(&three, maxdev::kInt64, {}, {}, 0, MAXDEV_DEVICE_CPU);
  ASSERT_EQ(run_add(&x.t, &scalar.t, 2.0, &x.t), MAXDEV_OK);
  EXPECT_EQ(std::vector<float>(f, f + 4), (std::vector<float>{7, 8, 9, 10}));
  // a partial overlap declines; shapes that do not broadcast are an error
  View shifted(f + 1, maxdev::kFloat32, {3}, {1});
  View head(f, maxdev::kFloat32, {3}, {1});
  EXPECT_EQ(run_add(&head.t, &head.t, 1.0, &shifted.t), MAXDEV_DECLINED);
  View wrong(b, maxdev::kFloat64, {2}, {1});
  std::string error;
  EXPECT_EQ(run_add(&self.t, &wrong.t, 1.0, &out.t, &error), MAXDEV_ERROR);
  EXPECT_EQ(error, "operand 2 of size 2 in dimension 1 does not broadcast to 3");
  // a two-element CPU "scalar" is an error naming the problem
  int64_t two[2] = {1, 2};
  View many(two, maxdev::kInt64, {2}, {1}, 0, MAXDEV_DEVICE_CPU);
  EXPECT_EQ(run_add(&x.t, &many.t, 1.0, &x.t, &error), MAXDEV_ERROR);
  EXPECT_EQ(error, "expected a one-element tensor, got 2 elements");
}

// --- Scalars, overlap, dtypes ---------------------------------------------

TEST(SdkCScalar, ReadsEveryRealDtypeAndBool) {
  char error[MAXDEV_ERROR_SIZE] = "";
  double d = 0;
  int64_t i = 0;
  int64_t big = INT64_MAX;
  View vbig(&big, maxdev::kInt64, {}, {});
  ASSERT_EQ(c_scalar_to_int64(&vbig.t, &i, error), MAXDEV_OK);
  EXPECT_EQ(i, INT64_MAX);  // exact, not through a double
  uint16_t h = c_float_to_float16(-1.5f), bf = c_float_to_bfloat16(3.0f);
  View vh(&h, maxdev::kFloat16, {1, 1}, {1, 1}), vbf(&bf, maxdev::kBFloat16, {}, {});
  ASSERT_EQ(c_scalar_to_double(&vh.t, &d, error), MAXDEV_OK);
  EXPECT_EQ(d, -1.5);
  ASSERT_EQ(c_scalar_to_int64(&vh.t, &i, error), MAXDEV_OK);
  EXPECT_EQ(i, -1);  // truncated toward zero
  ASSERT_EQ(c_scalar_to_double(&vbf.t, &d, error), MAXDEV_OK);
  EXPECT_EQ(d, 3.0);
  uint8_t flag = 7;
  View vb(&flag, maxdev::kBool, {}, {});
  ASSERT_EQ(c_scalar_to_int64(&vb.t, &i, error), MAXDEV_OK);
  EXPECT_EQ(i, 1);
  int8_t small = -8;
  View vi8(&small, maxdev::kInt8, {}, {});
  ASSERT_EQ(c_scalar_to_double(&vi8.t, &d, error), MAXDEV_OK);
  EXPECT_EQ(d, -8.0);
  uint64_t huge = UINT64_MAX;
  View vu64(&huge, maxdev_dtype{MAXDEV_TYPE_UINT, 64, 1}, {}, {});
  ASSERT_EQ(c_scalar_to_double(&vu64.t, &d, error), MAXDEV_OK);
  EXPECT_EQ(d, 18446744073709551615.0);
  EXPECT_EQ(c_scalar_to_int64(&vu64.t, &i, error), MAXDEV_ERROR);
  EXPECT_NE(std::string(error).find("cannot be converted to int64"), std::string::npos);
  float nan = std::nanf("");
  View vnan(&nan, maxdev::kFloat32, {}, {});
  EXPECT_EQ(c_scalar_to_int64(&vnan.t, &i, error), MAXDEV_ERROR);
  float c[2] = {1, 2};
  View vc(c, maxdev::kComplex64, {}, {});
  EXPECT_EQ(c_scalar_to_double(&vc.t, &d, error), MAXDEV_DECLINED);
  EXPECT_STREQ(error, "a scalar of dtype complex64 is not read as a real number");
}

TEST(SdkCOverlap, SameDisjointAndPartial) {
  float buf[8] = {};
  View all(buf, maxdev::kFloat32, {8}, {1}), first(buf, maxdev::kFloat32, {4}, {1}),
      second(buf, maxdev::kFloat32, {4}, {1}, 4), shifted(buf, maxdev::kFloat32, {4}, {1}, 2),
      reversed(buf, maxdev::kFloat32, {8}, {-1}, 7), evens(buf, maxdev::kFloat32, {4}, {2}),
      none(buf, maxdev::kFloat32, {0}, {1});
  EXPECT_EQ(c_tensor_overlap(&first.t, &first.t), MAXDEV_OVERLAP_SAME);
  EXPECT_EQ(c_tensor_overlap(&first.t, &second.t), MAXDEV_OVERLAP_NONE);
  EXPECT_EQ(c_tensor_overlap(&first.t, &shifted.t), MAXDEV_OVERLAP_PARTIAL);
  EXPECT_EQ(c_tensor_overlap(&all.t, &reversed.t), MAXDEV_OVERLAP_PARTIAL);
  EXPECT_EQ(c_tensor_overlap(&all.t, &evens.t), MAXDEV_OVERLAP_PARTIAL);
  EXPECT_EQ(c_tensor_overlap(&all.t, &none.t), MAXDEV_OVERLAP_NONE);
}

TEST(SdkCDtypes, BitsNamesSizesRoundTrip) {
  for (int b = 0; b < 12; ++b) {
    const uint64_t bit = uint64_t{1} << b;
    const maxdev_dtype d = c_dtype_of_bit(bit);
    EXPECT_EQ(c_dtype_bit(d), bit) << b;
    ASSERT_NE(c_dtype_name(d), nullptr);
    EXPECT_EQ(maxdev::dtype_name(d), c_dtype_name(d));  // the C++ SDK names through the C one
  }
  EXPECT_STREQ(c_dtype_name(maxdev::kBFloat16), "bfloat16");
  EXPECT_STREQ(c_dtype_name(maxdev_dtype{MAXDEV_TYPE_UINT, 32, 1}), "uint32");
  EXPECT_EQ(c_dtype_name(maxdev_dtype{MAXDEV_TYPE_FLOAT, 8, 1}), nullptr);
  EXPECT_EQ(c_dtype_bit(maxdev_dtype{MAXDEV_TYPE_FLOAT, 32, 4}), 0u);
  EXPECT_EQ(c_dtype_of_bit(3).lanes, 0);  // two bits: no dtype
  EXPECT_EQ(c_dtype_size(maxdev::kBool), 1);
  EXPECT_EQ(c_dtype_size(maxdev::kComplex128), 16);
}

TEST(SdkCDtypes, Float16RoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = c_float16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(c_float16_to_float(c_float_to_float16(f))));
      continue;
    }
    ASSERT_EQ(c_float_to_float16(f), h) << std::hex << h;
    ASSERT_EQ(static_cast<float>(maxdev::Half(f)), f);  // the C++ Half is the same code
  }
  EXPECT_EQ(c_float16_to_float(c_float_to_float16(1.0f + 1.0f / 2048)), 1.0f);  // tie: to even
  EXPECT_EQ(c_float16_to_float(c_float_to_float16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(c_float_to_float16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(c_float_to_float16(-1e-9f), 0x8000);    // underflows to -0
}

TEST(SdkCDtypes, BFloat16RoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = c_bfloat16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(c_bfloat16_to_float(c_float_to_bfloat16(f))));
      continue;
    }
    ASSERT_EQ(c_float_to_bfloat16(f), b) << std::hex << b;
  }
  EXPECT_EQ(c_bfloat16_to_float(c_float_to_bfloat16(1.0f + 1.0f / 256)), 1.0f);  // tie: to even
  EXPECT_EQ(c_bfloat16_to_float(c_float_to_bfloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
}

TEST(SdkCBroadcast, ShapeOfSeveralTensors) {
  float buf[1];
  View a(buf, maxdev::kFloat32, {2, 1, 3}, {3, 3, 1}), b(buf, maxdev::kFloat32, {4, 1}, {1, 1}),
      c(buf, maxdev::kFloat32, {5}, {1});
  const maxdev_tensor* ab[2] = {&a.t, &b.t};
  int64_t shape[4];
  int32_t ndim = -1;
  char error[MAXDEV_ERROR_SIZE] = "";
  ASSERT_EQ(c_broadcast_shape(2, ab, 4, shape, &ndim, error), MAXDEV_OK);
  EXPECT_EQ(std::vector<int64_t>(shape, shape + ndim), (std::vector<int64_t>{2, 4, 3}));
  EXPECT_EQ(c_broadcast_shape(2, ab, 2, shape, &ndim, error), MAXDEV_DECLINED);
  const maxdev_tensor* ac[2] = {&a.t, &c.t};
  EXPECT_EQ(c_broadcast_shape(2, ac, 4, shape, &ndim, error), MAXDEV_ERROR);
  EXPECT_STREQ(error, "shapes do not broadcast: size 5 against 3");
}

}  // namespace
