// Loading, negotiation, all-or-nothing registration and unloading, with
// real plugins built by this build.
#include <ATen/Parallel.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "dispatch/host_api.h"
#include "dispatch/op_table.h"
#include "loader_test_util.h"
#include "plugins/registry.h"

namespace maxdev::testing {
namespace {

using plugins::ErrorKind;
using plugins::PluginRegistry;

const plugins::OpReport* find_op(const std::vector<plugins::OpReport>& ops, const std::string& name) {
  for (const auto& op : ops) {
    if (op.op == name) return &op;
  }
  return nullptr;
}

// Names of the loaded plugins and of the ops with providers: what a user
// can observe of the registry.
std::string observable_state() {
  std::string out;
  for (const auto& p : PluginRegistry::instance().plugins()) out += "plugin " + p.name + "\n";
  for (const auto& op : PluginRegistry::instance().ops()) {
    out += op.op + ":";
    for (const auto& l : op.layers) out += " " + l.owner;
    out += "\n";
  }
  return out;
}

TEST(Loader, LoadedKernelServesTheOpAndUnloadReturnsItToTheFallback) {
  auto& registry = PluginRegistry::instance();
  const auto info = registry.load(fixture("good"), std::nullopt);
  EXPECT_EQ(info.name, "good");
  EXPECT_EQ(info.ops, std::vector<std::string>{"aten::neg.out"});

  at::Tensor x = at::ones({8}, at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, 0)));
  at::Tensor y = at::neg(x);
  EXPECT_EQ(y.device().type(), c10::DeviceType::PrivateUse1);
  EXPECT_FLOAT_EQ(y.cpu()[3].item<float>(), -1.0f);
  const auto ops = registry.ops();
  const auto* op = find_op(ops, "aten::neg.out");
  ASSERT_NE(op, nullptr);
  ASSERT_EQ(op->layers.size(), 1u);
  EXPECT_EQ(op->layers[0].owner, "good@1.0.0");
  EXPECT_EQ(op->layers[0].calls, 1);

  const auto report = registry.unload("good");
  EXPECT_TRUE(report.unmapped);
  EXPECT_EQ(find_op(registry.ops(), "aten::neg.out"), nullptr);
  EXPECT_FLOAT_EQ(at::neg(x).cpu()[0].item<float>(), -1.0f);  // the CPU fallback serves it again
}

TEST(Loader, LaterLoadsStackOnTopAndUnloadRevealsTheOneBelow) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("good"), std::nullopt);
  registry.load(fixture("good_copy"), std::nullopt);
  auto layers = find_op(registry.ops(), "aten::neg.out")->layers;
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].owner, "good@1.0.0");
  EXPECT_EQ(layers[1].owner, "good_copy@1.0.0");
  registry.unload("good_copy");
  layers = find_op(registry.ops(), "aten::neg.out")->layers;
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].owner, "good@1.0.0");
  registry.unload("good");
}

TEST(Loader, SameFileUnderTwoNamesIsTwoImages) {
  auto& registry = PluginRegistry::instance();
  const auto a = registry.load(fixture("good"), std::string("good_a"));
  const auto b = registry.load(fixture("good"), std::string("good_b"));
  EXPECT_EQ(a.sha256, b.sha256);
  EXPECT_NE(a.snapshot, b.snapshot);
  EXPECT_TRUE(registry.unload("good_a").unmapped);
  EXPECT_TRUE(registry.unload("good_b").unmapped);
}

TEST(Loader, NameAlreadyLoadedIsRefused) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("good"), std::nullopt);
  expect_plugin_error([&] { registry.load(fixture("good"), std::nullopt); }, ErrorKind::state,
                      "already loaded");
  registry.unload("good");
}

TEST(Loader, PinnedSha256MismatchChangesNothing) {
  auto& registry = PluginRegistry::instance();
  const std::string before = observable_state();
  plugins::LoadOptions pinned;
  pinned.sha256 = std::string(64, 'f');
  expect_plugin_error([&] { registry.load(fixture("good"), std::nullopt, {}, pinned); }, ErrorKind::hash_mismatch,
                      "not the pinned sha256 " + *pinned.sha256);
  EXPECT_EQ(observable_state(), before);
  const auto info = registry.load(fixture("good"), std::nullopt);
  pinned.sha256 = info.sha256;
  registry.unload("good");
  EXPECT_EQ(registry.load(fixture("good"), std::nullopt, {}, pinned).origin, "path");
  registry.unload("good");
}

TEST(Negotiation, CurrentVersionIsAccepted) {
  auto& registry = PluginRegistry::instance();
  const auto info = registry.load(fixture("good"), std::nullopt);
  EXPECT_EQ(info.abi_major, static_cast<uint32_t>(MAXDEV_ABI_MAJOR));
  EXPECT_EQ(info.abi_minor, static_cast<uint32_t>(MAXDEV_ABI_MINOR));
  registry.unload("good");
}

TEST(Negotiation, NewerMinorIsRefusedNamingBothVersions) {
  const std::string host = std::to_string(MAXDEV_ABI_MAJOR) + "." + std::to_string(MAXDEV_ABI_MINOR);
  expect_plugin_error([] { PluginRegistry::instance().load(fixture("abi_minor_newer"), std::nullopt); },
                      ErrorKind::abi_mismatch, "plugin ABI 1.99 is newer than this max_device's ABI " + host);
}

TEST(Negotiation, OtherMajorIsRefusedBeforeLoading) {
  expect_plugin_error([] { PluginRegistry::instance().load(fixture("abi_major_other"), std::nullopt); },
                      ErrorKind::abi_mismatch, "built for plugin ABI 2.");
}

TEST(AllOrNothing, AnUnknownOpRegistersNothing) {
  const std::string before = observable_state();
  const auto slots_before = dispatch::OpTable::instance().slots().size();
  expect_plugin_error([] { PluginRegistry::instance().load(fixture("unknown_op_last"), std::nullopt); },
                      ErrorKind::schema, "aten::definitely_not_an_op");
  EXPECT_EQ(observable_state(), before);
  EXPECT_EQ(dispatch::OpTable::instance().slots().size(), slots_before);
}

TEST(AllOrNothing, DuplicateOpIsAManifestError) {
  const std::string before = observable_state();
  expect_plugin_error([] { PluginRegistry::instance().load(fixture("duplicate_op"), std::nullopt); },
                      ErrorKind::manifest, "lists this op twice");
  EXPECT_EQ(observable_state(), before);
}

TEST(CustomOps, SchemaOutlivesItsPluginAndCannotChange) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("custom_op"), std::nullopt);
  EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({"fixture_ns::negate", "out"}).has_value());
  expect_plugin_error([&] { registry.load(fixture("custom_op_changed"), std::nullopt); }, ErrorKind::schema,
                      "keeps its schema for the life of the process");
  registry.unload("custom_op");
  // Still defined: a caller holding the op gets an error, never a dangling schema.
  const auto op = c10::Dispatcher::singleton().findSchema({"fixture_ns::negate", "out"});
  ASSERT_TRUE(op.has_value());
  at::Tensor x = device_tensor({4}).fill_(1.0);
  at::Tensor out = at::empty({4}, x.options());
  expect_error_naming([&] { op->typed<at::Tensor&(const at::Tensor&, at::Tensor&)>().call(x, out); },
                      {"plugin 'custom_op'", "was unloaded"});
  expect_plugin_error([&] { registry.load(fixture("custom_op_changed"), std::nullopt); }, ErrorKind::schema,
                      "restart the process");
  registry.load(fixture("custom_op"), std::nullopt);  // the same schema serves it again
  op->typed<at::Tensor&(const at::Tensor&, at::Tensor&)>().call(x, out);
  EXPECT_FLOAT_EQ(out.cpu()[0].item<float>(), -1.0f);
  registry.unload("custom_op");
}

TEST(Kernels, AnErrorNamesPluginOpAndFile) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("failing_kernel"), std::nullopt);
  at::Tensor x = device_tensor({4}).fill_(1.0);
  expect_error_naming([&] { at::neg(x); }, {"plugin 'failing_kernel'", "aten::neg.out", "failing_kernel.so",
                                             "fixture kernel failed on purpose"});
  registry.unload("failing_kernel");
}

// The calls and declines the (only) layer serving `op_name` counted.
void expect_layer_counts(const char* op_name, int64_t calls, int64_t declines) {
  const auto ops = PluginRegistry::instance().ops();
  const auto* op = find_op(ops, op_name);
  ASSERT_NE(op, nullptr) << op_name;
  EXPECT_EQ(op->layers[0].calls, calls) << op_name;
  EXPECT_EQ(op->layers[0].declines, declines) << op_name;
}

TEST(Kernels, DeclinedInputsFallToTheCpu) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("good"), std::nullopt);
  at::Tensor x = device_tensor({4, 4}).fill_(2.0).t();  // not contiguous: the fixture declines
  at::Tensor y = at::empty({4, 4}, x.options());
  at::neg_out(y, x);
  EXPECT_FLOAT_EQ(y.cpu()[1][2].item<float>(), -2.0f);
  expect_layer_counts("aten::neg.out", 0, 1);
  registry.unload("good");
}

// A max_device float tensor whose storage has no bytes yet (lazy
// allocation, as a storage made with a null DataPtr).
at::Tensor unallocated_tensor(c10::IntArrayRef sizes = {4}) {
  const c10::Device device(c10::DeviceType::PrivateUse1, 0);
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device), nullptr, false);
  at::Tensor x = at::detail::make_tensor<c10::TensorImpl>(std::move(empty), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                         caffe2::TypeMeta::Make<float>());
  x.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return x;
}

// A device tensor whose storage has no bytes yet (lazy allocation, as
// Caffe2-style tensors have) never reaches a plugin as a null pointer: the
// call is an error naming the op, and no provider runs.
TEST(Kernels, UnallocatedStorageIsAnErrorBeforeAnyProvider) {
  auto& registry = PluginRegistry::instance();
  registry.load(fixture("good"), std::nullopt);
  at::Tensor x = unallocated_tensor();
  at::Tensor y = device_tensor({4});
  expect_error_naming([&] { at::neg_out(y, x); }, {"no data allocated yet", "argument 'self' of aten::neg.out"});
  expect_layer_counts("aten::neg.out", 0, 0);
  registry.unload("good");
}

// With no plugin the CPU fallback, copy_ and item() alias the bytes: an
// error naming the op and argument, never a CPU kernel on a null pointer.
TEST(Kernels, UnallocatedStorageIsAnErrorOnTheCpuFallback) {
  at::Tensor x = unallocated_tensor();
  at::Tensor y = device_tensor({4});
  expect_error_naming([&] { at::neg_out(y, x); }, {"no data allocated yet", "argument 'self' of aten::neg.out"});
  expect_error_naming([&] { y.copy_(x); }, {"no data allocated yet"});
  expect_error_naming([&] { unallocated_tensor({1}).item(); }, {"no data allocated yet"});
  EXPECT_EQ(y.numel(), 4);
}

// What a plugin's host->parallel_for does (ABI 1.2): every index exactly
// once, on as many threads as torch.set_num_threads allows.
struct ParallelRun {
  std::mutex mutex;
  std::vector<int> hits;
  std::set<std::thread::id> threads;
  int64_t calls = 0;
};

ParallelRun run_parallel_for(int64_t n, int64_t grain) {
  ParallelRun run;
  run.hits.assign(static_cast<size_t>(n), 0);
  const maxdev_host_api* host = dispatch::host_api();
  host->parallel_for(nullptr, 0, n, grain, [](void* user, int64_t b, int64_t e) {
    auto& r = *static_cast<ParallelRun*>(user);
    std::lock_guard<std::mutex> lock(r.mutex);
    for (int64_t i = b; i < e; ++i) ++r.hits[static_cast<size_t>(i)];
    r.threads.insert(std::this_thread::get_id());
    ++r.calls;
  }, &run);
  std::lock_guard<std::mutex> lock(run.mutex);  // ordered after every worker's writes
  return ParallelRun{{}, run.hits, run.threads, run.calls};
}

TEST(HostApi, ParallelForRunsOnTorchsThreads) {
#if defined(__SANITIZE_THREAD__)
  // libgomp's futex barriers are invisible to TSan (run.sh runs it with
  // OMP_NUM_THREADS=1 for that reason): two OpenMP threads would report.
  GTEST_SKIP() << "OpenMP workers under TSan";
#endif
  ASSERT_TRUE(MAXDEV_HOST_HAS(dispatch::host_api(), parallel_for));
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  ParallelRun two = run_parallel_for(1000, 10);
  EXPECT_EQ(two.hits, std::vector<int>(1000, 1));
  EXPECT_EQ(two.threads.size(), 2u);
  at::set_num_threads(1);
  ParallelRun one = run_parallel_for(1000, 10);
  EXPECT_EQ(one.hits, std::vector<int>(1000, 1));
  EXPECT_EQ(one.threads, std::set<std::thread::id>{std::this_thread::get_id()});
  at::set_num_threads(2);
  ParallelRun small = run_parallel_for(8, 10);  // at most one grain: inline, one call
  EXPECT_EQ(small.calls, 1);
  EXPECT_EQ(small.threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(run_parallel_for(0, 10).calls, 0);
  at::set_num_threads(before);
}

// num_threads (ABI 1.4) is the count parallel_for splits a range into from
// the calling thread: torch's thread count outside a parallel region, 1 inside.
TEST(HostApi, NumThreadsIsWhatParallelForUses) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "OpenMP workers under TSan";  // as ParallelForRunsOnTorchsThreads
#endif
  const maxdev_host_api* host = dispatch::host_api();
  ASSERT_TRUE(MAXDEV_HOST_HAS(host, num_threads));
  const int before = at::get_num_threads();
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    EXPECT_EQ(host->num_threads(nullptr), threads);
  }
  at::set_num_threads(2);
  std::atomic<int> inside{-1};
  host->parallel_for(nullptr, 0, 2, 1, [](void* user, int64_t, int64_t) {
    static_cast<std::atomic<int>*>(user)->store(dispatch::host_api()->num_threads(nullptr));
  }, &inside);
  EXPECT_EQ(inside.load(), 1);
  at::set_num_threads(before);
}

}  // namespace
}  // namespace maxdev::testing
