#include "plugins/registry.h"

#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <set>

#include "common/log.h"
#include "dispatch/cpu_fallback.h"
#include "dispatch/custom_op_kernels.h"
#include "dispatch/dispatch_kind.h"
#include "dispatch/host_api.h"
#include "dispatch/kernel_provider.h"
#include "dispatch/op_table.h"
#include "plugins/plugin_library.h"
#include "plugins/snapshot.h"

namespace maxdev::plugins {

using dispatch::OpTable;

namespace {

// Older versions kept mapped for rollback; beyond this they are released.
constexpr size_t kKeptVersions = 2;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Namespaces no plugin may define ops in.
const std::set<std::string> kReservedNamespaces = {"aten", "prim", "prims", "torch", "c10", "_",
                                                   "quantized", "sparse", "mkldnn", "inductor",
                                                   "higher_order", "cuda", "max_device"};

std::string qualified(const c10::OperatorName& name) {
  return name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
}

// Namespaces that hold ops registered outside max_device (one pass over
// the dispatcher's ops per load, not per op).
std::set<std::string> foreign_namespaces(const std::set<std::string>& ours) {
  std::set<std::string> out;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const auto sep = name.name.find("::");
    if (sep != std::string::npos && ours.count(qualified(name)) == 0) out.insert(name.name.substr(0, sep));
  }
  return out;
}

// True on the thread that is making a change (holding the registry's mutex).
thread_local bool change_on_this_thread = false;

// Holds the registry's mutex for one change (load, reload, rollback, unload,
// overrides). Checks run inside a change and may call back (validate=True
// runs Python that lists plugins or ops): a nested change is refused with a
// clear error instead of deadlocking on the mutex.
class ChangeLock {
 public:
  explicit ChangeLock(std::mutex& mutex) {
    if (change_on_this_thread) {
      throw PluginError(ErrorKind::state, "", "", "",
                        "a plugin change (load, reload, rollback, unload, override) cannot start "
                        "inside a check of another change");
    }
    lock_ = std::unique_lock(mutex);
    change_on_this_thread = true;
  }
  ~ChangeLock() { change_on_this_thread = false; }
  ChangeLock(const ChangeLock&) = delete;
  ChangeLock& operator=(const ChangeLock&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
};

// For listings: inside a change on this thread the mutex is already held
// and nothing else can change, so the listing reads without it.
std::unique_lock<std::mutex> lock_for_listing(std::mutex& mutex) {
  return change_on_this_thread ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mutex);
}

}  // namespace

// One opened build of a plugin and the providers made from it.
struct PluginRegistry::Version {
  PluginInfo info;
  Snapshot snapshot;
  std::shared_ptr<PluginLibrary> library;
  std::shared_ptr<const dispatch::KernelOwner> owner;  // what its kernels share
  std::vector<std::pair<std::string, std::shared_ptr<dispatch::Provider>>> providers;  // (op, provider)
};

struct PluginRegistry::Plugin {
  std::string name;
  std::shared_ptr<Version> current;
  std::deque<std::shared_ptr<Version>> previous;  // oldest first
  int64_t next_generation = 1;
};

struct PluginRegistry::Override {
  uint64_t token;
  std::string op;
  std::shared_ptr<dispatch::Provider> provider;
};

// An op a plugin defined: its schema lives as long as some plugin serves it.
struct PluginRegistry::CustomOp {
  std::string name;    // "myplug::rms_norm"
  std::string schema;  // as the plugin wrote it
  std::unique_ptr<torch::Library> definition;
  std::set<std::string> users;  // plugins serving it
};

// A version checked and opened but not yet visible.
struct PluginRegistry::Prepared {
  std::shared_ptr<Version> version;
  std::vector<const KernelManifest*> to_define;
  Manifest manifest;
  std::chrono::steady_clock::time_point started;
};

PluginRegistry& PluginRegistry::instance() {
  static PluginRegistry registry;
  return registry;
}

PluginRegistry::PluginRegistry() = default;
PluginRegistry::~PluginRegistry() = default;

Manifest PluginRegistry::inspect(const std::string& path) {
  ErrorContext ctx{path, ""};
  return read_manifest(path, ctx);
}

PluginRegistry::Plugin& PluginRegistry::find(const std::string& name) {
  for (auto& p : plugins_) {
    if (p->name == name) return *p;
  }
  throw PluginError(ErrorKind::state, "", name, "", "no plugin of this name is loaded");
}

PluginRegistry::Prepared PluginRegistry::prepare(const std::string& path, const std::string& requested_name,
                                                 bool new_plugin, const LoadOptions& options, const Checks& checks) {
  Prepared prepared;
  prepared.started = std::chrono::steady_clock::now();
  ErrorContext ctx{path, requested_name};

  auto version = std::make_shared<Version>();
  version->snapshot = take_snapshot(
      path, options.allow_untrusted ? TrustPolicy::allow_untrusted : TrustPolicy::owner_only, ctx);
  struct SnapshotGuard {
    Version* v;
    ~SnapshotGuard() {
      if (v) remove_snapshot(v->snapshot);
    }
  } snapshot_guard{version.get()};
  // The pin is checked on the copy that would be opened, before anything
  // reads it: a file changed after the check is not what gets loaded.
  if (options.sha256 && *options.sha256 != version->snapshot.sha256) {
    ctx.fail(ErrorKind::hash_mismatch, "refused: its content has sha256 " + version->snapshot.sha256 +
                                           ", not the pinned sha256 " + *options.sha256 + "; nothing was opened");
  }

  // Everything from here reads the snapshot, never the user's path again.
  prepared.manifest = read_manifest(version->snapshot.path, ctx);
  const Manifest& manifest = prepared.manifest;
  const std::string name = requested_name.empty() ? manifest.name : requested_name;
  ctx.plugin = name;
  static const std::regex kName("[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}");
  if (!std::regex_match(name, kName)) {
    ctx.fail(ErrorKind::manifest, "plugin name must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  if (new_plugin && std::any_of(plugins_.begin(), plugins_.end(), [&](const auto& p) { return p->name == name; })) {
    ctx.fail(ErrorKind::state,
             "a plugin of this name is already loaded; reload it, unload it first, or load with another name=");
  }

  // Every op is checked before anything is registered.
  std::set<std::string> seen;
  std::optional<std::set<std::string>> foreign;  // computed on first need
  for (const auto& k : manifest.kernels) {
    if (!seen.insert(k.op).second) ctx.fail(ErrorKind::manifest, "the plugin lists this op twice", k.op);
    const auto sep = k.op.find("::");
    if (sep == std::string::npos || sep == 0) {
      ctx.fail(ErrorKind::schema, "op names are 'namespace::name[.overload]'", k.op);
    }
    const std::string ns = k.op.substr(0, sep);
    auto check_servable = [&] {
      try {
        OpTable::instance().check(k.op);
        dispatch::check_dispatch_kind(k.op, options.allow_composite);
      } catch (const std::invalid_argument& e) {
        ctx.fail(ErrorKind::schema, e.what(), k.op);
      }
    };
    if (k.schema.empty()) {
      check_servable();
      continue;
    }
    // A schema: either the op's existing schema restated, or a new op.
    std::optional<c10::FunctionSchema> parsed_or;
    try {
      parsed_or = torch::schema(k.schema.c_str());
    } catch (const std::exception& e) {
      ctx.fail(ErrorKind::schema, "malformed schema '" + k.schema + "': " + e.what(), k.op);
    }
    const c10::FunctionSchema& parsed = *parsed_or;
    if (qualified(parsed.operator_name()) != k.op) {
      ctx.fail(ErrorKind::schema, "the schema names another op (" + qualified(parsed.operator_name()) + ")", k.op);
    }
    auto existing = c10::Dispatcher::singleton().findSchema(parsed.operator_name());
    if (existing) {
      if (c10::toString(existing->schema()) != c10::toString(parsed)) {
        auto ours = std::find_if(custom_ops_.begin(), custom_ops_.end(),
                                 [&](const auto& c) { return c->name == k.op; });
        std::string hint;
        if (ours != custom_ops_.end()) {
          hint = " (defined by plugin '" + *(*ours)->users.begin() + "'; unload it first to change the schema)";
        }
        ctx.fail(ErrorKind::schema,
                 "schema '" + k.schema + "' contradicts the registered schema '" +
                     c10::toString(existing->schema()) + "'" + hint,
                 k.op);
      }
      check_servable();
      continue;
    }
    if (kReservedNamespaces.count(ns) != 0) {
      ctx.fail(ErrorKind::schema, "namespace '" + ns + "' belongs to PyTorch; define ops in your own namespace",
               k.op);
    }
    if (!foreign) {
      std::set<std::string> ours;
      for (const auto& c : custom_ops_) ours.insert(c->name);
      foreign = foreign_namespaces(ours);
    }
    if (foreign->count(ns) != 0) {
      ctx.fail(ErrorKind::schema, "namespace '" + ns + "' already holds ops registered outside max_device", k.op);
    }
    auto plan = dispatch::plan_signature(parsed);
    if (!plan.signature) ctx.fail(ErrorKind::schema, "cannot be served by a plugin: " + plan.why_not, k.op);
    prepared.to_define.push_back(&k);
  }

  if (checks.before_open) checks.before_open(version->snapshot.path);
  // Opening runs the plugin's constructors: the first plugin code to run.
  version->library = std::make_shared<PluginLibrary>(version->snapshot.path, manifest, ctx);
  maxdev_host_context init_ctx;
  init_ctx.plugin = &name;
  version->library->init(dispatch::host_api(), &init_ctx, ctx);

  PluginInfo& info = version->info;
  info.name = name;
  info.version = manifest.version;
  info.path = path;
  info.origin = options.origin;
  info.allow_untrusted = options.allow_untrusted;
  info.allow_composite = options.allow_composite;
  info.snapshot = version->snapshot.path;
  info.sha256 = version->snapshot.sha256;
  info.abi_major = manifest.abi_major;
  info.abi_minor = manifest.abi_minor;
  snapshot_guard.v = nullptr;  // the version owns its snapshot from here
  prepared.version = std::move(version);
  return prepared;
}

std::shared_ptr<PluginRegistry::Version> PluginRegistry::commit(Prepared prepared) {
  // Nothing here can fail for a reason of the plugin's making: prepare()
  // checked every op.
  Version& v = *prepared.version;
  for (const KernelManifest* k : prepared.to_define) {
    auto custom = std::make_unique<CustomOp>();
    custom->name = k->op;
    custom->schema = k->schema;
    const auto ns = k->op.substr(0, k->op.find("::"));
    custom->definition =
        std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt, __FILE__, __LINE__);
    custom->definition->def(k->schema.c_str());
    custom_ops_.push_back(std::move(custom));
    v.info.defines.push_back(k->op);
  }
  auto owner = std::make_shared<dispatch::KernelOwner>();
  owner->plugin = v.info.name;
  owner->owner = v.info.name + "@" + v.info.version;
  owner->file = v.info.path;
  owner->state = v.library->state();
  owner->keep_alive = v.library;
  v.owner = owner;
  for (const maxdev_kernel_def& kernel : v.library->kernels()) {
    // registers the trampoline on first use
    dispatch::add_custom_op_kernels(OpTable::instance().slot(kernel.op), kernel.meta != nullptr,
                                    kernel.backward != nullptr);
    v.providers.emplace_back(kernel.op, std::make_shared<dispatch::KernelProvider>(owner, kernel));
    v.info.ops.push_back(kernel.op);
    for (auto& c : custom_ops_) {
      if (c->name == kernel.op) c->users.insert(v.info.name);
    }
  }
  return prepared.version;
}

std::unique_ptr<dispatch::DispatchTable> PluginRegistry::build_table(const Version* replacing,
                                                                      const Version* with) const {
  auto table = std::make_unique<dispatch::DispatchTable>();
  auto push = [&](const std::string& op, const std::shared_ptr<dispatch::Provider>& provider) {
    const size_t index = OpTable::instance().slot(op).index;
    if (table->stacks.size() <= index) table->stacks.resize(index + 1);
    table->stacks[index].push_back(provider);
  };
  bool placed = false;
  for (const auto& p : plugins_) {
    const Version* v = p->current.get() == replacing ? with : p->current.get();
    placed = placed || v == with;
    for (const auto& [op, provider] : v->providers) push(op, provider);
  }
  if (with != nullptr && !placed) {
    for (const auto& [op, provider] : with->providers) push(op, provider);  // a new plugin: on top
  }
  for (const auto& o : overrides_) push(o.op, o.provider);
  return table;
}

void PluginRegistry::publish() {
  OpTable::instance().publish(build_table(nullptr, nullptr));  // returns once no call sees the old table
}

void PluginRegistry::vet(const Checks& checks, const std::shared_ptr<Version>& version, bool new_plugin) {
  if (!checks.before_publish) return;
  const Version* replacing = nullptr;
  if (!new_plugin) {
    for (const auto& p : plugins_) {
      if (p->name == version->info.name) replacing = p->current.get();
    }
  }
  auto candidate = build_table(replacing, version.get());
  try {
    dispatch::OpTable::Staged staged(candidate.get());
    checks.before_publish(version->info.ops);
  } catch (...) {
    log::error("plugin '" + version->info.name + "' " + version->info.version +
               " failed its checks before publish; nothing changed");
    release_custom_ops(version->info.name, new_plugin ? std::vector<std::string>{} : version->info.defines);
    close_versions({version}, nullptr);
    throw;
  }
}

// Forgets `plugin` as a user of the custom ops in `only` (all, if empty)
// and removes the ops nobody serves any more.
void PluginRegistry::release_custom_ops(const std::string& plugin, const std::vector<std::string>& only) {
  for (auto c = custom_ops_.begin(); c != custom_ops_.end();) {
    if (only.empty() || std::find(only.begin(), only.end(), (*c)->name) != only.end()) (*c)->users.erase(plugin);
    if ((*c)->users.empty()) {
      OpTable::instance().retire((*c)->name);
      c = custom_ops_.erase(c);  // destroys the definition
    } else {
      ++c;
    }
  }
}

void PluginRegistry::close_versions(std::vector<std::shared_ptr<Version>> versions, bool* all_unmapped) {
  for (auto& v : versions) {
    v->providers.clear();
    v->owner.reset();
    const bool unmapped = v->library->close();
    remove_snapshot(v->snapshot);
    if (!unmapped) {
      log::warn("plugin '" + v->info.name + "' " + v->info.version + ": its library is still mapped (" +
                v->info.snapshot + ") after dlclose: it holds GNU unique symbols or thread_local "
                "destructors; its code stays in memory");
    }
    if (all_unmapped != nullptr) *all_unmapped = *all_unmapped && unmapped;
  }
}

PluginInfo PluginRegistry::load(const std::string& path, const std::optional<std::string>& name,
                                const Checks& checks, const LoadOptions& options) {
  ChangeLock lock(mutex_);
  Prepared prepared = prepare(path, name.value_or(""), /*new_plugin=*/true, options, checks);
  const auto started = prepared.started;
  auto plugin = std::make_unique<Plugin>();
  plugin->name = prepared.version->info.name;
  plugin->current = commit(std::move(prepared));
  vet(checks, plugin->current, /*new_plugin=*/true);
  plugin->current->info.generation = plugin->next_generation++;
  plugins_.push_back(std::move(plugin));
  publish();
  PluginInfo& info = plugins_.back()->current->info;
  info.loaded_at_ns = now_ns();
  info.load_duration_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  log::info("loaded plugin '" + info.name + "' " + info.version + " from " + path + " (" +
            std::to_string(info.ops.size()) + " ops, sha256 " + info.sha256.substr(0, 12) + ")");
  return info;
}

PluginInfo PluginRegistry::reload(const std::string& name, const ReloadOptions& options, const Checks& checks) {
  ChangeLock lock(mutex_);
  Plugin& plugin = find(name);
  const PluginInfo& current = plugin.current->info;
  const std::string path = options.path.value_or(current.path);
  LoadOptions file;
  file.origin = options.origin.value_or(path == current.path ? current.origin : "path");
  file.sha256 = options.sha256;
  file.allow_untrusted = options.allow_untrusted.value_or(current.allow_untrusted);
  file.allow_composite = options.allow_composite.value_or(current.allow_composite);
  Prepared prepared;
  try {
    prepared = prepare(path, name, /*new_plugin=*/false, file, checks);
  } catch (const PluginError& e) {
    log::error("reload of plugin '" + name + "' refused; version " + plugin.current->info.version +
               " keeps serving: " + e.what());
    throw;
  }
  if (prepared.version->info.sha256 == plugin.current->info.sha256 && !options.force) {
    close_versions({prepared.version}, nullptr);  // identical content: nothing to do
    log::debug("reload of plugin '" + name + "': content unchanged, nothing to do");
    return plugin.current->info;
  }
  const auto started = prepared.started;
  std::shared_ptr<Version> fresh = commit(std::move(prepared));
  vet(checks, fresh, /*new_plugin=*/false);
  fresh->info.generation = plugin.next_generation++;
  plugin.previous.push_back(plugin.current);
  plugin.current = fresh;
  publish();
  std::vector<std::shared_ptr<Version>> released;
  while (plugin.previous.size() > kKeptVersions) {
    released.push_back(plugin.previous.front());
    plugin.previous.pop_front();
  }
  close_versions(std::move(released), nullptr);
  PluginInfo& info = fresh->info;
  info.loaded_at_ns = now_ns();
  info.load_duration_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  info.previous_versions = static_cast<int64_t>(plugin.previous.size());
  log::info("reloaded plugin '" + name + "': " + plugin.previous.back()->info.version + " -> " + info.version +
            " (generation " + std::to_string(info.generation) + ", sha256 " + info.sha256.substr(0, 12) + ", " +
            std::to_string(info.load_duration_ns / 1000) + " us)");
  return info;
}

PluginInfo PluginRegistry::rollback(const std::string& name) {
  ChangeLock lock(mutex_);
  Plugin& plugin = find(name);
  if (plugin.previous.empty()) {
    throw PluginError(ErrorKind::state, plugin.current->info.path, name, "",
                      "no previous version is still mapped to roll back to");
  }
  std::shared_ptr<Version> undone = plugin.current;
  plugin.current = plugin.previous.back();
  plugin.previous.pop_back();
  publish();
  close_versions({undone}, nullptr);  // a rolled-back version is not kept
  plugin.current->info.previous_versions = static_cast<int64_t>(plugin.previous.size());
  log::info("rolled back plugin '" + name + "': " + undone->info.version + " (generation " +
            std::to_string(undone->info.generation) + ") -> " + plugin.current->info.version + " (generation " +
            std::to_string(plugin.current->info.generation) + ")");
  return plugin.current->info;
}

UnloadReport PluginRegistry::unload(const std::string& name) {
  ChangeLock lock(mutex_);
  Plugin& plugin = find(name);
  auto it = std::find_if(plugins_.begin(), plugins_.end(), [&](const auto& p) { return p.get() == &plugin; });
  std::unique_ptr<Plugin> removed = std::move(*it);
  plugins_.erase(it);
  publish();  // returns once no call can reach the plugin
  release_custom_ops(name, {});
  UnloadReport report{name, true};
  std::vector<std::shared_ptr<Version>> versions(removed->previous.begin(), removed->previous.end());
  versions.push_back(removed->current);
  close_versions(std::move(versions), &report.unmapped);
  log::info("unloaded plugin '" + name + "'" + (report.unmapped ? "" : " (its library is still mapped)"));
  return report;
}

uint64_t PluginRegistry::push_override(const std::string& op, std::shared_ptr<dispatch::Provider> provider) {
  ChangeLock lock(mutex_);
  try {
    OpTable::instance().slot(op);
  } catch (const std::invalid_argument& e) {
    throw PluginError(ErrorKind::schema, "", "", op, std::string("cannot be overridden: ") + e.what());
  }
  const uint64_t token = next_token_++;
  overrides_.push_back({token, op, std::move(provider)});
  publish();
  return token;
}

bool PluginRegistry::remove_override(uint64_t token) {
  ChangeLock lock(mutex_);
  auto it = std::find_if(overrides_.begin(), overrides_.end(), [&](const auto& o) { return o.token == token; });
  if (it == overrides_.end()) return false;
  overrides_.erase(it);
  publish();
  return true;
}

size_t PluginRegistry::restore(const std::string& op) {
  ChangeLock lock(mutex_);
  const size_t before = overrides_.size();
  overrides_.erase(std::remove_if(overrides_.begin(), overrides_.end(), [&](const auto& o) { return o.op == op; }),
                   overrides_.end());
  const size_t removed = before - overrides_.size();
  if (removed > 0) publish();
  return removed;
}

std::vector<PluginInfo> PluginRegistry::plugins() const {
  const auto lock = lock_for_listing(mutex_);
  std::vector<PluginInfo> out;
  for (const auto& p : plugins_) {
    out.push_back(p->current->info);
    out.back().previous_versions = static_cast<int64_t>(p->previous.size());
    out.back().calls_in_flight = p->current->owner->in_flight.load(std::memory_order_relaxed);
  }
  return out;
}

std::vector<OpReport> PluginRegistry::ops() const {
  const auto lock = lock_for_listing(mutex_);
  std::vector<OpReport> out;
  std::map<std::string, int64_t> fallbacks;
  for (const auto& [op, n] : dispatch::fallback_counts()) fallbacks[op] = n;
  const auto* table = OpTable::instance().current();
  for (const auto* slot : OpTable::instance().slots()) {
    OpReport report;
    report.op = slot->name;
    report.fallbacks = fallbacks.count(slot->name) ? fallbacks[slot->name] : 0;
    if (slot->index < table->stacks.size()) {
      for (const auto& p : table->stacks[slot->index]) {
        report.layers.push_back({p->owner(), p->kind(), p->calls.load(), p->declines.load()});
      }
    }
    if (!report.layers.empty()) out.push_back(std::move(report));
  }
  return out;
}

}  // namespace maxdev::plugins
