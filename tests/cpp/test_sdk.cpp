// Tests of the header-only C++ SDK (plugin_api/include/max_device/plugin.hpp)
// against a fake host: no loader, no torch.
//
// This file also defines a plugin with MAXDEV_DEFINE_PLUGIN over SDK kernels,
// so the test executable exports maxdev_plugin_entry; link it into no other
// test binary that defines one.
#include <max_device/plugin.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------
// The fake host
// ---------------------------------------------------------------------------

struct maxdev_host_context {
  std::string error;
  int set_error_calls = 0;
  std::vector<std::pair<int32_t, std::string>> logs;
  // Tensors allocated by alloc_output, with their storage.
  struct Owned {
    maxdev_tensor t{};
    std::vector<int64_t> shape, strides;
    std::vector<float> data;
  };
  std::vector<std::unique_ptr<Owned>> allocs;
  std::vector<const maxdev_tensor*> outputs;
  bool fail_alloc = false;
};

namespace {

maxdev_status fake_alloc(maxdev_host_context* ctx, int32_t index, maxdev_dtype dtype,
                         int32_t ndim, const int64_t* shape, const maxdev_tensor** out) {
  if (ctx->fail_alloc) return MAXDEV_ERROR;
  auto o = std::make_unique<maxdev_host_context::Owned>();
  o->shape.assign(shape, shape + ndim);
  o->strides.resize(static_cast<size_t>(ndim));
  int64_t n = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    o->strides[static_cast<size_t>(d)] = n;
    n *= shape[d];
  }
  o->data.assign(static_cast<size_t>(n), 0.0f);
  o->t.data = o->data.data();
  o->t.device.device_type = MAXDEV_DEVICE_MAX;
  o->t.ndim = ndim;
  o->t.dtype = dtype;
  o->t.shape = o->shape.data();
  o->t.strides = o->strides.data();
  ctx->outputs.at(static_cast<size_t>(index)) = &o->t;
  *out = &o->t;
  ctx->allocs.push_back(std::move(o));
  return MAXDEV_OK;
}

maxdev_status fake_set_error(maxdev_host_context* ctx, const char* message) {
  ctx->error = message;
  ++ctx->set_error_calls;
  return MAXDEV_ERROR;
}

void fake_log(maxdev_host_context* ctx, int32_t level, const char* message) {
  ctx->logs.emplace_back(level, message);
}

const maxdev_host_api kHost = {sizeof(maxdev_host_api), MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR,
                               fake_alloc, fake_set_error, fake_log, nullptr, nullptr};

// A float32 device tensor over caller-owned storage.
struct TestTensor {
  std::vector<float> data;
  std::vector<int64_t> shape, strides;
  maxdev_tensor t{};
  TestTensor(std::vector<int64_t> s, std::vector<float> d, maxdev_dtype dtype = maxdev::kFloat32)
      : data(std::move(d)), shape(std::move(s)) {
    strides.resize(shape.size());
    int64_t n = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = n;
      n *= shape[i];
    }
    t.data = data.data();
    t.device.device_type = MAXDEV_DEVICE_MAX;
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = strides.data();
  }
};

maxdev_value tensor_value(const maxdev_tensor* t) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_TENSOR;
  v.u.tensor = t;
  return v;
}
maxdev_value int_value(int64_t i, uint32_t flags = 0) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_INT;
  v.flags = flags;
  v.u.i = i;
  return v;
}
maxdev_value float_value(double f, uint32_t flags = 0) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_FLOAT;
  v.flags = flags;
  v.u.f = f;
  return v;
}
maxdev_value bool_value(bool b) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_BOOL;
  v.u.b = b ? 1 : 0;
  return v;
}
maxdev_value none_value() {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_NONE;
  return v;
}
maxdev_value string_value(const char* s) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_STRING;
  v.u.string = s;
  return v;
}
maxdev_value int_list_value(const int64_t* data, int64_t size) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_INT_LIST;
  v.u.int_list.data = data;
  v.u.int_list.size = size;
  return v;
}
maxdev_value dtype_value(maxdev_dtype d) {
  maxdev_value v{};
  v.kind = MAXDEV_VALUE_DTYPE;
  v.u.dtype = d;
  return v;
}

// One call: arguments, preset outputs, the host context.
struct FakeCall {
  maxdev_host_context ctx;
  std::vector<maxdev_value> args;
  maxdev_call call{};
  explicit FakeCall(std::vector<maxdev_value> a, int num_outputs = 1,
                    std::vector<const maxdev_tensor*> preset = {}, void* state = nullptr)
      : args(std::move(a)) {
    ctx.outputs.assign(static_cast<size_t>(num_outputs), nullptr);
    for (size_t i = 0; i < preset.size(); ++i) ctx.outputs[i] = preset[i];
    call.struct_size = sizeof(maxdev_call);
    call.host = &kHost;
    call.ctx = &ctx;
    call.plugin_state = state;
    call.args = args.data();
    call.num_args = static_cast<int32_t>(args.size());
    call.num_outputs = num_outputs;
    call.outputs = ctx.outputs.data();
  }
  maxdev_status run(maxdev_kernel_fn fn) { return fn(&call); }
};

// ---------------------------------------------------------------------------
// Kernels under test
// ---------------------------------------------------------------------------

void ok_kernel(maxdev::Call&) {}
void declining_kernel(maxdev::Call&) { throw maxdev::Declined{}; }
void error_kernel(maxdev::Call&) { throw maxdev::Error("something precise went wrong"); }
void std_exception_kernel(maxdev::Call&) { throw std::out_of_range("vector index 7"); }
void int_throwing_kernel(maxdev::Call&) { throw 42; }
void tensor_of_arg0(maxdev::Call& call) { (void)call.tensor(0); }
void integer_of_arg1(maxdev::Call& call) { (void)call.integer(1); }
void real_of_arg0(maxdev::Call& call) { (void)call.real(0); }
void arg_out_of_range(maxdev::Call& call) { (void)call.tensor(5); }
void data_wrong_type(maxdev::Call& call) { (void)call.tensor(0).data<double>(); }
void state_missing(maxdev::Call& call) { (void)call.state<int>(); }

// relu written with the SDK: functional, allocates its output.
void sdk_relu(maxdev::Call& call) {
  const maxdev::Tensor x = call.tensor(0);
  if (!x.has_dtype(maxdev::kFloat32) || !x.is_contiguous()) throw maxdev::Declined{};
  maxdev::Tensor y = call.alloc_output(0, maxdev::kFloat32, x.shape());
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] > 0 ? in[i] : 0.0f;
  call.log(MAXDEV_LOG_DEBUG, "relu ran on " + std::to_string(x.numel()) + " elements");
}

// add.out written with the SDK: writes into the preset output.
void sdk_add_out(maxdev::Call& call) {
  const maxdev::Tensor a = call.tensor(0), b = call.tensor(1);
  const double alpha = call.real(2);
  maxdev::Tensor out = call.output(0);
  if (a.numel() != out.numel() || b.numel() != out.numel())
    throw maxdev::Error("add.out: shape mismatch");
  for (int64_t i = 0; i < a.numel(); ++i)
    out.data<float>()[i] = a.data<float>()[i] + static_cast<float>(alpha) * b.data<float>()[i];
}

struct Counter {
  int calls = 0;
};
void counting_kernel(maxdev::Call& call) { ++call.state<Counter>().calls; }

// Every accessor on one call: (self, dim int[]?, keepdim, *, dtype?, approximate str, out)
void accessor_kernel(maxdev::Call& call) {
  if (call.num_args() != 6) throw maxdev::Error("num_args");
  const maxdev::Tensor self = call.tensor(0);
  if (self.ndim() != 2 || self.size(0) != 2 || self.size(-1) != 3 || self.stride(0) != 3 ||
      self.stride(-1) != 1 || self.numel() != 6 || !self.is_contiguous() || self.is_cpu())
    throw maxdev::Error("tensor accessors");
  const auto dims = call.optional_int_list(1);
  if (!dims || dims->size() != 2 || (*dims)[0] != 0 || dims->at(1) != -1)
    throw maxdev::Error("int_list");
  if (!call.boolean(2)) throw maxdev::Error("boolean");
  if (call.optional_dtype(3).has_value()) throw maxdev::Error("optional dtype");
  if (call.string(4) != "tanh") throw maxdev::Error("string");
  if (call.optional_tensor(5).has_value() || !call.is_none(5)) throw maxdev::Error("optional");
}

#define TEST_KERNELS(K)                                                             \
  K("aten::relu", "", MAXDEV_SDK_KERNEL(sdk_relu), MAXDEV_DTYPE_FLOAT32, 0)         \
  K("aten::add.out", "", MAXDEV_SDK_KERNEL(sdk_add_out), MAXDEV_DTYPE_FLOAT32,      \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY)                                                  \
  K("sdktest::count", "sdktest::count(Tensor x) -> ()", MAXDEV_SDK_KERNEL(counting_kernel), 0, 0)

}  // namespace

// At file scope, as a plugin would write it.
MAXDEV_DEFINE_PLUGIN("sdk_test", "0.1.0", TEST_KERNELS, nullptr, nullptr)

namespace {

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

TEST(SdkAdapter, OkReturnsOk) {
  FakeCall c({});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(ok_kernel)), MAXDEV_OK);
  EXPECT_EQ(c.ctx.set_error_calls, 0);
}

TEST(SdkAdapter, DeclinedBecomesDeclined) {
  FakeCall c({});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(declining_kernel)), MAXDEV_DECLINED);
  EXPECT_EQ(c.ctx.set_error_calls, 0);
}

TEST(SdkAdapter, ErrorBecomesErrorWithMessage) {
  FakeCall c({});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(error_kernel)), MAXDEV_ERROR);
  EXPECT_EQ(c.ctx.set_error_calls, 1);
  EXPECT_EQ(c.ctx.error, "something precise went wrong");
}

TEST(SdkAdapter, StdExceptionBecomesErrorWithWhat) {
  FakeCall c({});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(std_exception_kernel)), MAXDEV_ERROR);
  EXPECT_EQ(c.ctx.error, "vector index 7");
}

TEST(SdkAdapter, NonStdExceptionDoesNotEscape) {
  FakeCall c({});
  maxdev_status st = MAXDEV_OK;
  EXPECT_NO_THROW(st = c.run(MAXDEV_SDK_KERNEL(int_throwing_kernel)));
  EXPECT_EQ(st, MAXDEV_ERROR);
  EXPECT_EQ(c.ctx.error, "unknown C++ exception");
}

TEST(SdkAdapter, AdapterIsNoexceptCFunction) {
  maxdev_kernel_fn fn = MAXDEV_SDK_KERNEL(int_throwing_kernel);
  EXPECT_NE(fn, nullptr);
  EXPECT_TRUE(noexcept(maxdev::detail::kernel_adapter<&int_throwing_kernel>(nullptr)));
}

TEST(SdkAdapter, NullCallIsAnErrorNotACrash) {
  EXPECT_EQ(MAXDEV_SDK_KERNEL(ok_kernel)(nullptr), MAXDEV_ERROR);
}

TEST(SdkAccessors, WrongKindNamesIndexAndKinds) {
  TestTensor x({2}, {1, 2});
  {
    FakeCall c({int_value(3)});
    EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(tensor_of_arg0)), MAXDEV_ERROR);
    EXPECT_EQ(c.ctx.error, "argument 0: expected Tensor, got int");
  }
  {
    FakeCall c({tensor_value(&x.t), float_value(1.5)});
    EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(integer_of_arg1)), MAXDEV_ERROR);
    EXPECT_EQ(c.ctx.error, "argument 1: expected int, got float");
  }
  {
    FakeCall c({none_value()});
    EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(real_of_arg0)), MAXDEV_ERROR);
    EXPECT_EQ(c.ctx.error, "argument 0: expected float, int or bool, got None");
  }
  {
    FakeCall c({tensor_value(&x.t)});
    EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(arg_out_of_range)), MAXDEV_ERROR);
    EXPECT_NE(c.ctx.error.find("argument 5 out of range"), std::string::npos) << c.ctx.error;
  }
}

TEST(SdkAccessors, RealAcceptsIntFloatBool) {
  FakeCall c({int_value(2, MAXDEV_VALUE_FLAG_SCALAR), float_value(0.5), bool_value(true)});
  maxdev::Call call(&c.call);
  EXPECT_EQ(call.real(0), 2.0);
  EXPECT_TRUE(call.is_scalar(0));
  EXPECT_EQ(call.real(1), 0.5);
  EXPECT_FALSE(call.is_scalar(1));
  EXPECT_EQ(call.real(2), 1.0);
  EXPECT_THROW(call.integer(2), maxdev::Error);
  EXPECT_TRUE(call.boolean(2));
}

TEST(SdkAccessors, AllKinds) {
  TestTensor x({2, 3}, {1, 2, 3, 4, 5, 6});
  const int64_t dims[] = {0, -1};
  FakeCall c({tensor_value(&x.t), int_list_value(dims, 2), bool_value(true), none_value(),
              string_value("tanh"), none_value()});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(accessor_kernel)), MAXDEV_OK) << c.ctx.error;

  maxdev::Call call(&c.call);
  EXPECT_EQ(call.kind(3), MAXDEV_VALUE_NONE);
  EXPECT_FALSE(call.optional_int_list(3).has_value());
  FakeCall d({dtype_value(maxdev::kFloat64)});
  maxdev::Call dcall(&d.call);
  EXPECT_TRUE(maxdev::same_dtype(dcall.dtype(0), maxdev::kFloat64));
  EXPECT_EQ(maxdev::dtype_name(dcall.dtype(0)), "float64");
}

TEST(SdkTensor, DataChecksDtype) {
  TestTensor x({2}, {1, 2});
  FakeCall c({tensor_value(&x.t)});
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(data_wrong_type)), MAXDEV_ERROR);
  EXPECT_EQ(c.ctx.error, "tensor has dtype float32, data<float64>() needs float64");
  maxdev::Tensor t(&x.t);
  EXPECT_EQ(t.data<float>(), x.data.data());
  EXPECT_EQ(t.data<const float>(), x.data.data());
}

TEST(SdkTensor, ByteOffsetStridesAndDims) {
  std::vector<float> buf = {9, 0, 1, 2, 3, 4, 5};
  int64_t shape[2] = {3, 2};
  int64_t strides[2] = {1, 3};  // a transposed [2, 3]
  maxdev_tensor raw{};
  raw.data = buf.data();
  raw.device.device_type = MAXDEV_DEVICE_CPU;
  raw.ndim = 2;
  raw.dtype = maxdev::kFloat32;
  raw.shape = shape;
  raw.strides = strides;
  raw.byte_offset = sizeof(float);
  maxdev::Tensor t(&raw);
  EXPECT_EQ(*t.data<float>(), 0.0f);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.is_cpu());
  EXPECT_EQ(t.size(-2), 3);
  EXPECT_EQ(t.stride(1), 3);
  EXPECT_EQ(t.shape().vec(), (std::vector<int64_t>{3, 2}));
  EXPECT_THROW(t.size(2), maxdev::Error);
  EXPECT_THROW(t.size(-3), maxdev::Error);
}

TEST(SdkOutputs, AllocOutputForFunctionalOp) {
  TestTensor x({2, 2}, {-1, 2, -3, 4});
  FakeCall c({tensor_value(&x.t)});
  ASSERT_EQ(c.run(MAXDEV_SDK_KERNEL(sdk_relu)), MAXDEV_OK) << c.ctx.error;
  ASSERT_EQ(c.ctx.allocs.size(), 1u);
  const auto& y = c.ctx.allocs[0];
  EXPECT_EQ(y->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(y->data, (std::vector<float>{0, 2, 0, 4}));
  EXPECT_EQ(c.ctx.outputs[0], &y->t);
  ASSERT_EQ(c.ctx.logs.size(), 1u);
  EXPECT_EQ(c.ctx.logs[0].first, MAXDEV_LOG_DEBUG);
  EXPECT_EQ(c.ctx.logs[0].second, "relu ran on 4 elements");
}

TEST(SdkOutputs, AllocFailureIsAnError) {
  TestTensor x({2}, {1, 2});
  FakeCall c({tensor_value(&x.t)});
  c.ctx.fail_alloc = true;
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(sdk_relu)), MAXDEV_ERROR);
  EXPECT_NE(c.ctx.error.find("alloc_output(0) failed"), std::string::npos) << c.ctx.error;
}

TEST(SdkOutputs, AliasedOutputIsPreset) {
  TestTensor a({3}, {1, 2, 3}), b({3}, {10, 20, 30}), out({3}, {0, 0, 0});
  FakeCall c({tensor_value(&a.t), tensor_value(&b.t), int_value(2, MAXDEV_VALUE_FLAG_SCALAR),
              tensor_value(&out.t)},
             1, {&out.t});
  ASSERT_EQ(c.run(MAXDEV_SDK_KERNEL(sdk_add_out)), MAXDEV_OK) << c.ctx.error;
  EXPECT_EQ(out.data, (std::vector<float>{21, 42, 63}));
}

TEST(SdkOutputs, UnsetOutputIsAnError) {
  FakeCall c({}, 1);
  maxdev::Call call(&c.call);
  EXPECT_THROW(call.output(0), maxdev::Error);
  EXPECT_THROW(call.output(1), maxdev::Error);
}

TEST(SdkState, StateReachesKernel) {
  Counter counter;
  TestTensor x({1}, {0});
  FakeCall c({tensor_value(&x.t)}, 0, {}, &counter);
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(counting_kernel)), MAXDEV_OK);
  EXPECT_EQ(c.run(MAXDEV_SDK_KERNEL(counting_kernel)), MAXDEV_OK);
  EXPECT_EQ(counter.calls, 2);
  FakeCall none({});
  EXPECT_EQ(none.run(MAXDEV_SDK_KERNEL(state_missing)), MAXDEV_ERROR);
  EXPECT_NE(none.ctx.error.find("no state"), std::string::npos);
}

TEST(SdkDtypes, ConstantsAndNames) {
  EXPECT_TRUE(maxdev_dtype_is(maxdev::kFloat32, MAXDEV_TYPE_FLOAT, 32));
  EXPECT_TRUE(maxdev_dtype_is(maxdev::kInt64, MAXDEV_TYPE_INT, 64));
  EXPECT_TRUE(maxdev_dtype_is(maxdev::kBool, MAXDEV_TYPE_BOOL, 8));
  EXPECT_TRUE(maxdev_dtype_is(maxdev::kBFloat16, MAXDEV_TYPE_BFLOAT, 16));
  EXPECT_EQ(maxdev::dtype_name(maxdev::kFloat32), "float32");
  EXPECT_EQ(maxdev::dtype_name(maxdev::kUInt8), "uint8");
  EXPECT_EQ(maxdev::dtype_name(maxdev::kBool), "bool");
  EXPECT_EQ(maxdev::dtype_name(maxdev::kBFloat16), "bfloat16");
  EXPECT_EQ(maxdev::dtype_name(maxdev::kComplex64), "complex64");
  using maxdev::operator==;
  using maxdev::operator!=;
  EXPECT_TRUE(maxdev::kFloat32 == maxdev::kFloat32);
  EXPECT_TRUE(maxdev::kFloat32 != maxdev::kFloat64);
}

TEST(SdkPlugin, DefinePluginWithSdkKernels) {
  const maxdev_plugin_def* def = nullptr;
  ASSERT_EQ(maxdev_plugin_entry(&kHost, &def), MAXDEV_OK);
  ASSERT_NE(def, nullptr);
  EXPECT_STREQ(def->name, "sdk_test");
  EXPECT_EQ(def->abi_major, static_cast<uint32_t>(MAXDEV_ABI_MAJOR));
  ASSERT_EQ(def->num_kernels, 3);
  EXPECT_STREQ(def->kernels[0].op, "aten::relu");
  EXPECT_STREQ(def->kernels[2].schema, "sdktest::count(Tensor x) -> ()");
  // The table's function runs through the adapter.
  TestTensor x({2}, {-5, 5});
  FakeCall c({tensor_value(&x.t)});
  ASSERT_EQ(c.run(def->kernels[0].fn), MAXDEV_OK);
  EXPECT_EQ(c.ctx.allocs.at(0)->data, (std::vector<float>{0, 5}));
  // A host of another major is refused.
  maxdev_host_api other = kHost;
  other.abi_major = MAXDEV_ABI_MAJOR + 1;
  EXPECT_EQ(maxdev_plugin_entry(&other, &def), MAXDEV_ERROR);
}

// --- Helpers every plugin used to rewrite ----------------------------------

// A view over `data` with explicit shape, strides (elements) and offset.
template <typename T>
struct View {
  std::vector<int64_t> shape, strides;
  maxdev_tensor t{};
  View(T* data, std::vector<int64_t> s, std::vector<int64_t> st, int64_t offset = 0)
      : shape(std::move(s)), strides(std::move(st)) {
    t.data = data;
    t.byte_offset = static_cast<uint64_t>(offset) * sizeof(T);
    t.device.device_type = MAXDEV_DEVICE_MAX;
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = maxdev::dtype_of<T>::value;
    t.shape = shape.data();
    t.strides = strides.data();
  }
  maxdev::Tensor tensor() const { return maxdev::Tensor(&t); }
};

TEST(SdkHelpers, HalfAndBFloat16RoundToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* smallest normal */,
                  5.960464477539063e-08f /* smallest subnormal */}) {
    EXPECT_EQ(static_cast<float>(maxdev::Half(v)), v) << v;
  }
  EXPECT_EQ(static_cast<float>(maxdev::Half(1.0f + 1.0f / 2048)), 1.0f);  // tie: to even
  EXPECT_EQ(static_cast<float>(maxdev::Half(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_TRUE(std::isinf(static_cast<float>(maxdev::Half(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(maxdev::Half(std::nanf("")))));
  EXPECT_EQ(static_cast<float>(maxdev::BFloat16(1.0f + 1.0f / 256)), 1.0f);  // tie: to even
  EXPECT_EQ(static_cast<float>(maxdev::BFloat16(-3.0f)), -3.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(maxdev::BFloat16(std::nanf("")))));
}

TEST(SdkHelpers, DtypeDispatchPicksTheTypeAndDeclinesOthers) {
  auto name = [](maxdev_dtype d) {
    return maxdev::dispatch_real(d, [](auto tag) {
      return maxdev::dtype_name(maxdev::dtype_of<typename decltype(tag)::type>::value);
    });
  };
  EXPECT_EQ(name(maxdev::kFloat32), "float32");
  EXPECT_EQ(name(maxdev::kFloat64), "float64");
  EXPECT_EQ(name(maxdev::kBFloat16), "bfloat16");
  EXPECT_EQ(name(maxdev::kFloat16), "float16");
  EXPECT_EQ(name(maxdev::kInt32), "int32");
  EXPECT_EQ(name(maxdev::kUInt8), "uint8");
  EXPECT_THROW(name(maxdev::kComplex64), maxdev::Declined);
  EXPECT_THROW(maxdev::dispatch_floating(maxdev::kInt64, [](auto) { return 0; }), maxdev::Declined);
}

TEST(SdkHelpers, ScalarValueReadsAnyRealDtype) {
  int64_t i = -7;
  double d = 2.5;
  uint8_t b = 1;
  maxdev::Half h(0.5f);
  View<int64_t> vi(&i, {}, {});
  View<double> vd(&d, {}, {});
  View<maxdev::Half> vh(&h, {1}, {1});
  View<uint8_t> vb(&b, {}, {});
  vb.t.dtype = maxdev::kBool;
  EXPECT_EQ(maxdev::scalar_value<double>(vi.tensor()), -7.0);
  EXPECT_EQ(maxdev::scalar_value<float>(vd.tensor()), 2.5f);
  EXPECT_EQ(maxdev::scalar_value<double>(vh.tensor()), 0.5);
  EXPECT_EQ(maxdev::scalar_value<int>(vb.tensor()), 1);
  float two[2] = {1, 2};
  View<float> many(two, {2}, {1});
  EXPECT_THROW(maxdev::scalar_value<float>(many.tensor()), maxdev::Error);
}

TEST(SdkHelpers, OverlapTellsSameDisjointAndPartial) {
  float buf[8] = {};
  View<float> all(buf, {8}, {1});
  View<float> first(buf, {4}, {1});
  View<float> second(buf, {4}, {1}, 4);
  View<float> shifted(buf, {4}, {1}, 2);
  View<float> reversed(buf, {8}, {-1}, 7);
  EXPECT_EQ(maxdev::overlap(first.tensor(), first.tensor()), maxdev::Overlap::same);
  EXPECT_EQ(maxdev::overlap(first.tensor(), second.tensor()), maxdev::Overlap::none);
  EXPECT_EQ(maxdev::overlap(first.tensor(), shifted.tensor()), maxdev::Overlap::partial);
  EXPECT_EQ(maxdev::overlap(all.tensor(), reversed.tensor()), maxdev::Overlap::partial);
  EXPECT_THROW(maxdev::check_no_partial_overlap(first.tensor(), {second.tensor(), shifted.tensor()}),
               maxdev::Error);
  EXPECT_NO_THROW(maxdev::check_no_partial_overlap(first.tensor(), {first.tensor(), second.tensor()}));
}

TEST(SdkHelpers, BroadcastShape) {
  const int64_t a[] = {2, 1, 3}, b[] = {4, 1}, c[] = {5};
  EXPECT_EQ(maxdev::broadcast_shape({maxdev::ArrayView<int64_t>(a, 3), maxdev::ArrayView<int64_t>(b, 2)}),
            (std::vector<int64_t>{2, 4, 3}));
  EXPECT_THROW(maxdev::broadcast_shape({maxdev::ArrayView<int64_t>(a, 3), maxdev::ArrayView<int64_t>(c, 1)}),
               maxdev::Error);
}

TEST(SdkHelpers, ElementwiseBroadcastsAndFollowsAnyStrides) {
  // a: 2x3 transposed view of a 3x2 buffer; b: a row [3] broadcast over rows,
  // read backwards (negative stride); out: contiguous 2x3.
  double abuf[6] = {0, 1, 2, 3, 4, 5};  // as 3x2: a[i][j] = abuf[j*2 + i]
  double bbuf[3] = {30, 20, 10};
  double obuf[6] = {};
  View<double> a(abuf, {2, 3}, {1, 2});
  View<double> b(bbuf, {3}, {-1}, 2);  // b = [10, 20, 30]
  View<double> out(obuf, {2, 3}, {3, 1});
  maxdev::elementwise<double>(out.tensor(), [](double x, double y) { return x + y; }, a.tensor(), b.tensor());
  EXPECT_EQ(std::vector<double>(obuf, obuf + 6), (std::vector<double>{10, 22, 34, 11, 23, 35}));
  // A 0-dim operand broadcasts everywhere; a stride-0 (expanded) one too.
  double s = 100;
  View<double> scalar(&s, {}, {});
  View<double> expanded(bbuf, {2, 3}, {0, 1});
  maxdev::elementwise<double>(out.tensor(), [](double x, double y) { return x - y; }, expanded.tensor(),
                              scalar.tensor());
  EXPECT_EQ(std::vector<double>(obuf, obuf + 6), (std::vector<double>{-70, -80, -90, -70, -80, -90}));
  View<float> wrong(nullptr, {2, 3}, {3, 1});
  EXPECT_THROW(maxdev::elementwise<double>(out.tensor(), [](double x) { return x; }, wrong.tensor()),
               maxdev::Error);
  View<double> mismatched(abuf, {4}, {1});
  EXPECT_THROW(maxdev::elementwise<double>(out.tensor(), [](double x) { return x; }, mismatched.tensor()),
               maxdev::Error);
}

TEST(SdkHelpers, ContiguousOperandsRunAsOneSpanAndEmptyOnesNotAtAll) {
  float buf[24] = {};
  View<float> x(buf, {2, 3, 4}, {12, 4, 1});
  int runs = 0;
  int64_t seen = 0;
  maxdev::for_each_run<2>(x.tensor().shape(), {x.tensor(), x.tensor()},
                          [&](const std::array<char*, 2>&, int64_t n, const std::array<int64_t, 2>& step) {
                            ++runs;
                            seen += n;
                            EXPECT_EQ(step[0], 4);
                          });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(seen, 24);
  View<float> empty(buf, {0, 3}, {3, 1});
  maxdev::for_each_run<1>(empty.tensor().shape(), {empty.tensor()},
                          [&](const std::array<char*, 1>&, int64_t, const std::array<int64_t, 1>&) { ++runs; });
  EXPECT_EQ(runs, 1);
}

}  // namespace
