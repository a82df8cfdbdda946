// The add call path without Python, one mode per process (registrations are
// process-wide). bench_plugin_call.py runs it when it has been built.
//
//   bench_call_path plugin <libreference.so>   at::add on max_device, plugin kernel via the loader
//   bench_call_path native <libbench_native_add.so>  at::add on max_device, TORCH_LIBRARY_IMPL kernel
//   bench_call_path fallback                   at::add on max_device, no kernel: the zero-copy CPU fallback
//   bench_call_path cpu                        at::add on CPU tensors
//   bench_call_path kernel <libreference.so>   the plugin's add.out kernel called directly
//                                              through the C ABI (no dispatcher, no loader)
//   bench_call_path loop                       the native kernel's float loop alone
//
// Options after the mode: --numel N --blocks B --calls C --warmup W.
// Prints one JSON object: per-call nanoseconds of each block.
#include <ATen/ATen.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <max_device/plugin.h>

#include "dispatch/cpu_fallback.h"
#include "plugins/registry.h"

namespace {

struct Options {
  std::string mode, path;
  int64_t numel = 64, blocks = 20, calls = 2000, warmup = 2000;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<double> run_blocks(const Options& o, const std::function<void()>& call) {
  for (int64_t i = 0; i < o.warmup; ++i) call();
  std::vector<double> per_call;
  for (int64_t b = 0; b < o.blocks; ++b) {
    const int64_t t0 = now_ns();
    for (int64_t i = 0; i < o.calls; ++i) call();
    per_call.push_back(double(now_ns() - t0) / double(o.calls));
  }
  return per_call;
}

void check_close(const at::Tensor& got, const at::Tensor& want) {
  if (!at::allclose(got.cpu(), want)) throw std::runtime_error("wrong result");
}

// --- calling a plugin kernel through the C ABI by hand ---------------------

maxdev_status no_alloc(maxdev_host_context*, int32_t, maxdev_dtype, int32_t, const int64_t*,
                       const maxdev_tensor**) {
  return MAXDEV_ERROR;
}
maxdev_status record_error(maxdev_host_context*, const char* m) {
  std::fprintf(stderr, "kernel error: %s\n", m);
  return MAXDEV_ERROR;
}
void ignore_log(maxdev_host_context*, int32_t, const char*) {}

__attribute__((noinline)) void float_loop(const float* x, const float* y, float a, float* o,
                                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + a * y[i];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int i = 1;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s plugin|native|cpu|kernel|loop [path] [--numel N] ...\n", argv[0]);
    return 2;
  }
  o.mode = argv[i++];
  if (i < argc && std::strncmp(argv[i], "--", 2) != 0) o.path = argv[i++];
  for (; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--numel") o.numel = v;
    else if (k == "--blocks") o.blocks = v;
    else if (k == "--calls") o.calls = v;
    else if (k == "--warmup") o.warmup = v;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  at::manual_seed(0);
  std::vector<double> per_call;
  std::string note;
  try {
    if (o.mode == "plugin" || o.mode == "native" || o.mode == "fallback" || o.mode == "cpu") {
      if (o.mode == "plugin") {
        maxdev::plugins::PluginRegistry::instance().load(o.path, std::nullopt);
      } else if (o.mode == "native") {
        // As torch.ops.load_library with max_device imported: at::add
        // reaches the native add.out
        maxdev::dispatch::suspend_direct_fallbacks();
        const bool loaded = dlopen(o.path.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr;
        maxdev::dispatch::resume_direct_fallbacks();
        if (!loaded) throw std::runtime_error(std::string("dlopen: ") + dlerror());
      }
      at::Tensor a = at::randn({o.numel}), b = at::randn({o.numel});
      const at::Tensor want = at::add(a, b);
      if (o.mode != "cpu") {
        a = a.to(c10::Device(c10::DeviceType::PrivateUse1, 0));
        b = b.to(c10::Device(c10::DeviceType::PrivateUse1, 0));
      }
      check_close(at::add(a, b), want);
      per_call = run_blocks(o, [&] { at::Tensor c = at::add(a, b); });
      if (o.mode == "plugin") {
        for (const auto& op : maxdev::plugins::PluginRegistry::instance().ops())
          if (op.op == "aten::add.out" && !op.layers.empty())
            note = "add.out plugin calls " + std::to_string(op.layers.back().calls);
      }
    } else if (o.mode == "kernel") {
      void* lib = dlopen(o.path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
      auto entry = reinterpret_cast<maxdev_plugin_entry_fn>(dlsym(lib, MAXDEV_ENTRY_SYMBOL));
      if (entry == nullptr) throw std::runtime_error("no entry point");
      const maxdev_host_api host{sizeof(maxdev_host_api), MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR,
                                 no_alloc, record_error, ignore_log, nullptr, nullptr, nullptr};
      const maxdev_plugin_def* def = nullptr;
      if (entry(&host, &def) != MAXDEV_OK) throw std::runtime_error("entry refused");
      maxdev_kernel_fn fn = nullptr;
      for (int64_t k = 0; k < def->num_kernels; ++k)
        if (std::strcmp(def->kernels[k].op, "aten::add.out") == 0) fn = def->kernels[k].fn;
      if (fn == nullptr) throw std::runtime_error("no aten::add.out kernel");
      std::vector<float> x(o.numel, 1.5f), y(o.numel, 2.0f), z(o.numel, 0.0f);
      int64_t shape[1] = {o.numel}, strides[1] = {1};
      auto view = [&](std::vector<float>& v) {
        maxdev_tensor t{};
        t.data = v.data();
        t.device = {MAXDEV_DEVICE_MAX, 0};
        t.ndim = 1;
        t.dtype = {MAXDEV_TYPE_FLOAT, 32, 1};
        t.shape = shape;
        t.strides = strides;
        return t;
      };
      maxdev_tensor tx = view(x), ty = view(y), tz = view(z);
      maxdev_value args[4]{};
      args[0].kind = MAXDEV_VALUE_TENSOR; args[0].u.tensor = &tx;
      args[1].kind = MAXDEV_VALUE_TENSOR; args[1].u.tensor = &ty;
      args[2].kind = MAXDEV_VALUE_INT; args[2].flags = MAXDEV_VALUE_FLAG_SCALAR; args[2].u.i = 1;
      args[3].kind = MAXDEV_VALUE_TENSOR; args[3].u.tensor = &tz;
      const maxdev_tensor* outs[1] = {&tz};
      const maxdev_call call{sizeof(maxdev_call), &host, nullptr, nullptr, args, 4, 1, outs};
      if (fn(&call) != MAXDEV_OK || z[0] != 3.5f) throw std::runtime_error("kernel failed");
      per_call = run_blocks(o, [&] { fn(&call); });
    } else if (o.mode == "loop") {
      std::vector<float> x(o.numel, 1.5f), y(o.numel, 2.0f), z(o.numel, 0.0f);
      per_call = run_blocks(o, [&] { float_loop(x.data(), y.data(), 1.0f, z.data(), o.numel); });
    } else {
      std::fprintf(stderr, "unknown mode %s\n", o.mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_call_path %s: %s\n", o.mode.c_str(), e.what());
    return 1;
  }
  std::printf("{\"mode\": \"%s\", \"numel\": %lld, \"calls_per_block\": %lld, \"note\": \"%s\", "
              "\"per_call_ns\": [",
              o.mode.c_str(), (long long)o.numel, (long long)o.calls, note.c_str());
  for (size_t k = 0; k < per_call.size(); ++k)
    std::printf("%s%.2f", k ? ", " : "", per_call[k]);
  std::printf("]}\n");
  return 0;
}
