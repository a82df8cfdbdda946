// Hot swap under load: two threads call plugin kernels while the main
// thread swaps version 1 and version 2 of the reference plugin 1,000 times.
// No call may fail, every result must be exactly one version's, and file
// descriptors, mappings and memory must stay bounded.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/full.h>
#include <ATen/ops/relu.h>
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/log.h"
#include "loader_test_util.h"
#include "plugins/registry.h"
#include "plugins/snapshot.h"

namespace maxdev::testing {
namespace {

int64_t count_entries(const char* dir) {
  int64_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// The process's mappings, each as "<path or [kind]> <permissions>" (no
// addresses: a mapping that moved is the same mapping).
std::multiset<std::string> mappings() {
  std::multiset<std::string> out;
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode >> path;
    out.insert((path.empty() ? "[anonymous]" : path) + " " + perms);
  }
  return out;
}

int64_t count_if_contains(const std::multiset<std::string>& maps, const std::string& part) {
  return std::count_if(maps.begin(), maps.end(), [&](const std::string& m) { return m.find(part) != m.npos; });
}

// The mappings of `after` not in `before`, one per line.
std::string added(const std::multiset<std::string>& before, const std::multiset<std::string>& after) {
  std::vector<std::string> diff;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(diff));
  std::string out;
  for (const auto& m : diff) out += "\n  " + m;
  return out;
}

int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

TEST(HotSwapStress, TwoThreadsCallWhileTheMainThreadSwapsAThousandTimes) {
  auto& registry = plugins::PluginRegistry::instance();
  log::set_level("warn");  // a thousand "reloaded" lines say nothing
  struct RestoreLevel {
    ~RestoreLevel() { log::set_level("info"); }
  } restore_level;
  const std::string v1 = example_plugin("reference"), v2 = example_plugin("reference_v2");
  registry.load(v1, std::nullopt);
  const auto version_op = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("reference::version", "")
                              .typed<at::Tensor(const at::Tensor&)>();

  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0}, failures{0}, wrong{0};
  auto worker = [&] {
    at::Tensor probe = device_tensor({16}).fill_(-1.0);
    at::Tensor expected_relu = at::relu(probe.cpu());
    while (!stop.load(std::memory_order_relaxed)) {
      try {
        const at::Tensor v = version_op.call(probe).cpu();
        const float first = v[0].item<float>();
        if ((first != 1.0f && first != 2.0f) || !v.eq(first).all().item<bool>()) wrong++;
        if (!at::relu(probe).cpu().equal(expected_relu)) wrong++;
      } catch (const std::exception&) {
        failures++;
      }
      calls++;
    }
  };

  constexpr int kSwaps = 1000, kWarmup = 50;
  int64_t fds = 0, rss = 0;
  std::multiset<std::string> maps;
  std::thread a(worker), b(worker);
  for (int i = 0; i < kSwaps; ++i) {
    if (i == kWarmup) {
      fds = count_entries("/proc/self/fd");
      maps = mappings();
      rss = rss_kib();
    }
    plugins::ReloadOptions options;
    options.path = i % 2 == 0 ? v2 : v1;
    registry.reload("reference", options);
  }
  stop = true;
  a.join();
  b.join();

  EXPECT_GT(calls.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(count_entries("/proc/self/fd") - fds, 2) << "file descriptors leak across reloads";
  // A version that stays mapped adds its image's 4 to 5 mappings: the
  // snapshots mapped must be as many as after the warm-up (the current
  // version and the two kept for rollback). Other mappings may grow by a
  // few (the allocator's regions; a sanitizer's), far below one per swap.
  const auto maps_now = mappings();
  const std::string& snapshots = plugins::snapshot_directory();
  EXPECT_LE(count_if_contains(maps_now, snapshots), count_if_contains(maps, snapshots))
      << "plugin images stay mapped across reloads; new mappings:" << added(maps, maps_now);
  EXPECT_LE(static_cast<int64_t>(maps_now.size()) - static_cast<int64_t>(maps.size()), kSwaps / 20)
      << "mappings leak across reloads; new mappings:" << added(maps, maps_now);
  EXPECT_LE(rss_kib() - rss, 64 * 1024) << "memory grows across reloads";
  const auto info = registry.plugins().front();
  EXPECT_EQ(info.generation, kSwaps + 1);
  EXPECT_LE(info.previous_versions, 2);
  std::cout << "[ stress   ] " << calls.load() << " calls during " << kSwaps << " swaps\n";
  EXPECT_TRUE(registry.unload("reference").unmapped);
}

}  // namespace
}  // namespace maxdev::testing
