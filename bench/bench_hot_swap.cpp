// Hot-swap costs, without Python. One mode per process; each prints one JSON
// object on its last line. bench_hot_swap.py runs the modes in rounds and
// summarizes them.
//
//   bench_hot_swap readpath A.so [--threads 1,2] [--reps R] [--iters N]
//       The trampoline's read path (ReadGuard + OpTable::current() + the
//       op's provider stack) in a tight loop on 1..T threads at once, beside
//       a plain call, an acquire load of a shared pointer and a copy of a
//       shared std::shared_ptr (refcount). ns per iteration, wall and
//       thread CPU time.
//   bench_hot_swap reload A.so B.so [--reloads N] [--publishes M]
//       PluginRegistry::reload alternating between two builds of one plugin;
//       OpTable::publish of a copy of the current table alone (idle, and
//       with a thread calling an op meanwhile); push_override/remove_override.
//   bench_hot_swap latency A.so B.so --op k0|add [--threads 1,2] [--calls N] [--rounds R]
//       Per-call latency of 1..T threads calling one op of the swapped plugin
//       ("k0": bench100::k0 on 64 float32; "add": at::add on 64 float32 via
//       the reference plugin) while the main thread (a) waits, (b) reloads
//       between the two builds continuously, (c) spins (CPU contention
//       without swaps). Every result is checked.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "dispatch/epoch.h"
#include "dispatch/op_table.h"
#include "plugins/registry.h"

namespace {

using maxdev::dispatch::OpTable;
using maxdev::plugins::PluginRegistry;
using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Keeps a value alive for the compiler (like benchmark::DoNotOptimize).
template <class T>
inline void keep(const T& v) {
  asm volatile("" : : "r,m"(v) : "memory");
}

struct Args {
  std::vector<std::string> paths;
  std::vector<int> threads{1, 2};
  std::string op = "k0";
  int64_t reps = 15, iters = 20000000, reloads = 100, publishes = 200, calls = 200000, rounds = 3;
};

Args parse(int argc, char** argv, int first) {
  Args a;
  int i = first;
  for (; i < argc && std::strncmp(argv[i], "--", 2) != 0; ++i) a.paths.push_back(argv[i]);
  for (; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      a.threads.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) a.threads.push_back(std::stoi(t));
    } else if (k == "--op") a.op = v;
    else if (k == "--reps") a.reps = std::stoll(v);
    else if (k == "--iters") a.iters = std::stoll(v);
    else if (k == "--reloads") a.reloads = std::stoll(v);
    else if (k == "--publishes") a.publishes = std::stoll(v);
    else if (k == "--calls") a.calls = std::stoll(v);
    else if (k == "--rounds") a.rounds = std::stoll(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  if (i != argc) throw std::invalid_argument("option without a value");
  return a;
}

std::string json_list(const std::vector<double>& v, int prec = 2) {
  std::string s = "[";
  char buf[64];
  for (size_t k = 0; k < v.size(); ++k) {
    std::snprintf(buf, sizeof buf, "%s%.*f", k ? ", " : "", prec, v[k]);
    s += buf;
  }
  return s + "]";
}

std::vector<double> to_double(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Starts `n` threads running body(t) together (a spinning start line) and
// joins them.
void run_together(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      body(t);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  for (auto& th : ts) th.join();
}

// --- (1) the read path ------------------------------------------------------

__attribute__((noinline)) uintptr_t direct(uintptr_t x) {
  asm volatile("");
  return x + 1;
}

int g_value = 42;
std::atomic<const int*> g_pointer{&g_value};
std::shared_ptr<int> g_shared = std::make_shared<int>(42);
size_t g_slot = 0;  // bench100::k0's slot

using Loop = void (*)(int64_t);

void loop_empty(int64_t n) {
  for (int64_t i = 0; i < n; ++i) keep(i);
}
void loop_direct(int64_t n) {
  for (int64_t i = 0; i < n; ++i) keep(direct(uintptr_t(i)));
}
void loop_atomic(int64_t n) {
  for (int64_t i = 0; i < n; ++i) keep(direct(uintptr_t(g_pointer.load(std::memory_order_acquire))));
}
void loop_shared(int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    std::shared_ptr<int> copy = g_shared;
    keep(direct(uintptr_t(copy.get())));
  }
}
// What Trampoline::operator() does before it calls a provider.
void loop_read_path(int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    maxdev::dispatch::ReadGuard guard;
    const maxdev::dispatch::DispatchTable* table = OpTable::instance().current();
    uintptr_t top = 0;
    if (g_slot < table->stacks.size()) {
      const auto& providers = table->stacks[g_slot];
      if (!providers.empty()) top = uintptr_t(providers.back().get());
    }
    keep(direct(top));
  }
}

int readpath(const Args& a) {
  if (a.paths.size() != 1) throw std::invalid_argument("readpath needs one plugin path");
  PluginRegistry::instance().load(a.paths[0], std::nullopt);
  g_slot = OpTable::instance().slot("bench100::k0").index;
  {
    maxdev::dispatch::ReadGuard guard;
    const auto* t = OpTable::instance().current();
    if (g_slot >= t->stacks.size() || t->stacks[g_slot].empty())
      throw std::runtime_error("bench100::k0 has no provider");
  }
  const std::vector<std::pair<std::string, Loop>> variants = {
      {"empty_loop", loop_empty},
      {"direct_call", loop_direct},
      {"atomic_acquire_load", loop_atomic},
      {"shared_ptr_copy", loop_shared},
      {"read_path", loop_read_path}};
  // results[variant][threads] -> samples (one per thread per rep)
  std::vector<std::vector<std::vector<double>>> wall(variants.size()), cpu(variants.size());
  for (auto& v : wall) v.resize(a.threads.size());
  for (auto& v : cpu) v.resize(a.threads.size());
  for (int64_t r = 0; r < a.reps; ++r) {
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      // Rotate the order of the variants each rep.
      const size_t v = (vi + size_t(r)) % variants.size();
      for (size_t ti = 0; ti < a.threads.size(); ++ti) {
        const int n = a.threads[ti];
        std::vector<double> w(n), c(n);
        run_together(n, [&](int t) {
          variants[v].second(a.iters / 10);  // warmup
          const int64_t c0 = thread_cpu_ns(), w0 = now_ns();
          variants[v].second(a.iters);
          const int64_t w1 = now_ns(), c1 = thread_cpu_ns();
          w[t] = double(w1 - w0) / double(a.iters);
          c[t] = double(c1 - c0) / double(a.iters);
        });
        wall[v][ti].insert(wall[v][ti].end(), w.begin(), w.end());
        cpu[v][ti].insert(cpu[v][ti].end(), c.begin(), c.end());
      }
    }
  }
  std::printf("{\"mode\": \"readpath\", \"iters\": %lld, \"reps\": %lld, \"membarrier\": %s, \"results\": [",
              (long long)a.iters, (long long)a.reps,
              maxdev::dispatch::epoch_detail::readers_need_fence ? "false" : "true");
  bool first = true;
  for (size_t v = 0; v < variants.size(); ++v) {
    for (size_t ti = 0; ti < a.threads.size(); ++ti) {
      std::printf("%s{\"variant\": \"%s\", \"threads\": %d, \"wall_ns\": %s, \"cpu_ns\": %s}", first ? "" : ", ",
                  variants[v].first.c_str(), a.threads[ti], json_list(wall[v][ti], 3).c_str(),
                  json_list(cpu[v][ti], 3).c_str());
      first = false;
    }
  }
  std::printf("]}\n");
  return 0;
}

// --- shared by (2) and (3) --------------------------------------------------

class Declines final : public maxdev::dispatch::Provider {
 public:
  Declines() : Provider("bench", "override", "bench declines") {}
  bool run(const maxdev::dispatch::CallArgs&, maxdev::dispatch::Returns&) override {
    return false;
  }
};

at::Tensor to_device(const at::Tensor& t) { return t.to(c10::Device(c10::DeviceType::PrivateUse1, 0)); }

// Alternates between two builds; returns the reload's wall time (ns).
struct Swapper {
  Swapper(std::string n, std::string first, std::string second) : name(std::move(n)), paths{first, second} {}
  std::string name, paths[2];
  int next = 1;  // paths[0] is loaded first
  std::vector<std::string> versions_seen;
  int64_t reload(int64_t* loader_ns = nullptr) {
    maxdev::plugins::ReloadOptions o;
    o.path = paths[next];
    const int64_t t0 = now_ns();
    auto info = PluginRegistry::instance().reload(name, o);
    const int64_t t1 = now_ns();
    if (loader_ns) *loader_ns = info.load_duration_ns;
    versions_seen.push_back(info.version);
    next ^= 1;
    return t1 - t0;
  }
};

// A plugin op called from C++; checks each result against the CPU.
struct Caller {
  std::string op;
  std::optional<c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>> k0;
  at::Tensor a, b, want;

  explicit Caller(const std::string& which) : op(which) {
    a = at::randn({64});
    b = at::randn({64});
    if (op == "k0") {
      k0 = c10::Dispatcher::singleton().findSchemaOrThrow("bench100::k0", "").typed<at::Tensor(const at::Tensor&)>();
      want = a.clone();
    } else if (op == "add") {
      want = at::add(a, b);
    } else {
      throw std::invalid_argument("--op must be k0 or add");
    }
    a = to_device(a);
    b = to_device(b);
  }
  at::Tensor call() const { return op == "k0" ? k0->call(a) : at::add(a, b); }
  // Device memory is host memory: compare in place.
  bool ok(const at::Tensor& got) const {
    if (got.numel() != 64 || got.device().type() != c10::DeviceType::PrivateUse1) return false;
    const float* g = static_cast<const float*>(got.data_ptr());
    const float* w = want.data_ptr<float>();
    for (int i = 0; i < 64; ++i)
      if (std::fabs(g[i] - w[i]) > 1e-6f * std::fabs(w[i]) + 1e-7f) return false;
    return true;
  }
};

std::string first_op(const std::string& which) { return which == "add" ? "aten::add.out" : "bench100::k0"; }

// --- (2) reload and publish ---------------------------------------------------

int reload(const Args& a) {
  if (a.paths.size() != 2) throw std::invalid_argument("reload needs two plugin paths");
  auto info = PluginRegistry::instance().load(a.paths[0], std::nullopt);
  Swapper sw(info.name, a.paths[0], a.paths[1]);
  const size_t ops = info.ops.size();
  Caller caller("k0");
  if (!caller.ok(caller.call())) throw std::runtime_error("bench100::k0 gave a wrong result");
  auto& table = OpTable::instance();
  auto& reg = PluginRegistry::instance();

  for (int i = 0; i < 4; ++i) sw.reload();  // warmup
  table.publish(table.copy_current());
  reg.remove_override(reg.push_override("bench100::k0", std::make_shared<Declines>()));

  std::vector<int64_t> reload_ns, loader_ns, copy_ns, publish_ns, publish_busy_ns, push_ns, remove_ns;
  // Interleaved: blocks of 10 reloads, then publishes, then overrides.
  const int64_t blocks = std::max<int64_t>(1, a.reloads / 10);
  const int64_t pubs_per_block = std::max<int64_t>(1, a.publishes / blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < 10; ++i) {
      int64_t l = 0;
      reload_ns.push_back(sw.reload(&l));
      loader_ns.push_back(l);
    }
    for (int64_t i = 0; i < pubs_per_block; ++i) {
      const int64_t t0 = now_ns();
      auto copy = table.copy_current();
      const int64_t t1 = now_ns();
      table.publish(std::move(copy));
      const int64_t t2 = now_ns();
      copy_ns.push_back(t1 - t0);
      publish_ns.push_back(t2 - t1);
    }
    for (int64_t i = 0; i < pubs_per_block / 4 + 1; ++i) {
      const int64_t t0 = now_ns();
      const uint64_t token = reg.push_override("bench100::k0", std::make_shared<Declines>());
      const int64_t t1 = now_ns();
      reg.remove_override(token);
      const int64_t t2 = now_ns();
      push_ns.push_back(t1 - t0);
      remove_ns.push_back(t2 - t1);
    }
  }
  // Publish while one thread keeps calling bench100::k0 (the grace period
  // has a reader to wait for).
  std::atomic<bool> stop{false};
  std::atomic<int64_t> busy_calls{0}, bad{0};
  std::thread busy([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      if (!caller.ok(caller.call())) bad.fetch_add(1);
      busy_calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (busy_calls.load() < 1000) std::this_thread::yield();
  for (int64_t i = 0; i < a.publishes; ++i) {
    auto copy = table.copy_current();
    const int64_t t0 = now_ns();
    table.publish(std::move(copy));
    publish_busy_ns.push_back(now_ns() - t0);
  }
  stop = true;
  busy.join();
  if (bad.load() != 0) throw std::runtime_error("wrong results during publishes");
  int alternations = 0;
  for (size_t k = 1; k < sw.versions_seen.size(); ++k) alternations += sw.versions_seen[k] != sw.versions_seen[k - 1];
  if (alternations != int(sw.versions_seen.size()) - 1) throw std::runtime_error("reloads did not alternate versions");

  std::printf("{\"mode\": \"reload\", \"plugin_ops\": %zu, \"table_slots\": %zu, \"versions\": [\"%s\", \"%s\"], "
              "\"reload_ns\": %s, \"reload_loader_reported_ns\": %s, \"copy_current_ns\": %s, "
              "\"publish_ns\": %s, \"publish_busy_reader_ns\": %s, \"busy_reader_calls\": %lld, "
              "\"push_override_ns\": %s, \"remove_override_ns\": %s}\n",
              ops, table.slots().size(), sw.versions_seen[0].c_str(), sw.versions_seen[1].c_str(),
              json_list(to_double(reload_ns), 0).c_str(), json_list(to_double(loader_ns), 0).c_str(),
              json_list(to_double(copy_ns), 0).c_str(), json_list(to_double(publish_ns), 0).c_str(),
              json_list(to_double(publish_busy_ns), 0).c_str(), (long long)busy_calls.load(),
              json_list(to_double(push_ns), 0).c_str(), json_list(to_double(remove_ns), 0).c_str());
  return 0;
}

// --- (3) call latency during swaps -------------------------------------------

struct Percentiles {
  double p50, p99, p999, max, mean;
};

Percentiles percentiles(std::vector<uint32_t>& v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return double(v[std::min(v.size() - 1, size_t(q * double(v.size())))]); };
  double sum = 0;
  for (uint32_t x : v) sum += x;
  return {at(0.50), at(0.99), at(0.999), double(v.back()), sum / double(v.size())};
}

int latency(const Args& a) {
  if (a.paths.size() != 2) throw std::invalid_argument("latency needs two plugin paths");
  at::set_num_threads(1);
  auto info = PluginRegistry::instance().load(a.paths[0], std::nullopt);
  Swapper sw(info.name, a.paths[0], a.paths[1]);
  Caller caller(a.op);
  if (!caller.ok(caller.call())) throw std::runtime_error(a.op + " gave a wrong result");
  for (int i = 0; i < 4; ++i) sw.reload();  // warmup

  const char* conditions[] = {"idle", "reload", "spin"};
  std::string out = "[";
  for (int64_t r = 0; r < a.rounds; ++r) {
    for (int threads : a.threads) {
      for (int ci = 0; ci < 3; ++ci) {
        const int c = (ci + int(r)) % 3;  // rotate the conditions' order
        std::vector<std::vector<uint32_t>> lat(threads, std::vector<uint32_t>(a.calls));
        std::atomic<int> running{threads};
        std::atomic<int64_t> bad{0}, failed{0};
        std::vector<int64_t> reload_ns;
        int64_t spins = 0;
        std::thread main_work([&] {
          if (c == 1) {
            while (running.load(std::memory_order_acquire) > 0) reload_ns.push_back(sw.reload());
          } else if (c == 2) {
            while (running.load(std::memory_order_acquire) > 0) {
              for (int k = 0; k < 1000; ++k) keep(direct(uintptr_t(k)));
              ++spins;
            }
          }
        });
        run_together(threads, [&](int t) {
          for (int i = 0; i < 2000; ++i) caller.call();  // warmup
          auto& mine = lat[t];
          for (int64_t i = 0; i < a.calls; ++i) {
            const auto t0 = Clock::now();
            at::Tensor y;
            try {
              y = caller.call();
            } catch (const std::exception&) {
              failed.fetch_add(1);
            }
            const auto t1 = Clock::now();
            mine[i] = uint32_t(std::min<int64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count(), UINT32_MAX));
            if (y.defined() && !caller.ok(y)) bad.fetch_add(1);
          }
          running.fetch_sub(1, std::memory_order_release);
        });
        main_work.join();
        std::vector<uint32_t> all;
        for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
        const Percentiles p = percentiles(all);
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%s{\"round\": %lld, \"threads\": %d, \"condition\": \"%s\", \"calls\": %zu, "
                      "\"p50_ns\": %.0f, \"p99_ns\": %.0f, \"p999_ns\": %.0f, \"max_ns\": %.0f, \"mean_ns\": %.1f, "
                      "\"wrong_results\": %lld, \"failed_calls\": %lld, \"reloads\": %zu, \"reload_ns\": ",
                      out.size() > 1 ? ", " : "", (long long)r, threads, conditions[c], all.size(), p.p50, p.p99,
                      p.p999, p.max, p.mean, (long long)bad.load(), (long long)failed.load(), reload_ns.size());
        out += buf;
        out += json_list(to_double(reload_ns), 0) + "}";
        std::fprintf(stderr, "round %lld threads %d %-6s p50 %6.0f p99 %7.0f p99.9 %8.0f max %9.0f ns, %zu reloads\n",
                     (long long)r, threads, conditions[c], p.p50, p.p99, p.p999, p.max, reload_ns.size());
        if (bad.load() != 0 || failed.load() != 0) throw std::runtime_error("wrong or failed calls");
      }
    }
  }
  out += "]";
  std::printf("{\"mode\": \"latency\", \"op\": \"%s\", \"plugin\": \"%s\", \"calls_per_thread\": %lld, "
              "\"phases\": %s}\n",
              first_op(a.op).c_str(), info.name.c_str(), (long long)a.calls, out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s readpath|reload|latency PLUGIN... [--options]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  try {
    maxdev::log::set_level("warn");  // one info line per reload would drown the output
    at::manual_seed(0);
    const Args a = parse(argc, argv, 2);
    if (mode == "readpath") return readpath(a);
    if (mode == "reload") return reload(a);
    if (mode == "latency") return latency(a);
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_hot_swap %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
