#include "plugins/registry.h"

#include <pthread.h>
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

// Holds the change mutex for one change (load, reload, rollback, unload,
// overrides). Checks run inside a change and may call back (validate=True
// runs Python): a nested change is refused with a clear error instead of
// deadlocking on the mutex.
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
  uint64_t id = 0;
  std::string name;
  std::shared_ptr<Version> current;
  std::deque<std::shared_ptr<Version>> previous;  // oldest first
  int64_t next_generation = 1;
  std::map<std::string, Counts> history;  // per op: counts of versions no longer serving
};

struct PluginRegistry::Override {
  uint64_t token;
  std::string op;
  std::shared_ptr<dispatch::Provider> provider;
};

// An op a plugin defined. Once published its schema stays for the life of
// the process: PyTorch's dispatcher cannot drop a schema while Python holds
// the op or another thread is calling it. Only a refused change's own
// definitions (never published) are removed again.
struct PluginRegistry::CustomOp {
  std::string name;    // "myplug::rms_norm"
  std::string schema;  // as the plugin wrote it
  std::unique_ptr<torch::Library> definition;
  bool published = false;
  std::set<std::string> users;  // plugins with a mapped version serving it
  std::string last_plugin, last_file;  // who served it last, for the unserved error
};

// A version checked and opened but not yet visible.
struct PluginRegistry::Prepared {
  std::shared_ptr<Version> version;
  std::vector<const KernelManifest*> to_define;
  std::vector<std::string> defined_before;  // ops it defines whose definition this process kept
  Manifest manifest;
  std::chrono::steady_clock::time_point started;
};

PluginRegistry& PluginRegistry::instance() {
  static PluginRegistry registry;
  return registry;
}

namespace {
// Whether this thread's fork took the change lock. Per thread: two threads
// may fork at once, and each runs its own fork handlers.
thread_local bool fork_took_change_lock = false;
}  // namespace

// fork() copies only the forking thread. A lock another thread holds would
// stay held in the child forever, so the lists' lock is taken around the
// fork (its holders never wait for anything), and the change lock is taken
// if free; a change running on another thread (it may wait for the GIL this
// thread holds, so fork cannot wait for it) is simply absent in the child.
void PluginRegistry::before_fork() {
  auto& r = instance();
  fork_took_change_lock = !change_on_this_thread && r.change_mutex_.try_lock();
  r.state_mutex_.lock();
}

void PluginRegistry::after_fork_in_parent() {
  auto& r = instance();
  r.state_mutex_.unlock();
  if (fork_took_change_lock) r.change_mutex_.unlock();
}

void PluginRegistry::after_fork_in_child() {
  auto& r = instance();
  r.state_mutex_.unlock();
  if (fork_took_change_lock) {
    r.change_mutex_.unlock();
  } else if (!change_on_this_thread) {
    new (&r.change_mutex_) std::mutex;  // held by a thread the child does not have
  }
}

void PluginRegistry::abandon_change_after_fork() {
  if (!change_on_this_thread) return;
  change_on_this_thread = false;
  change_mutex_.unlock();
}

PluginRegistry::PluginRegistry() {
  ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
}
PluginRegistry::~PluginRegistry() = default;

Manifest PluginRegistry::inspect(const std::string& path) {
  ErrorContext ctx{path, ""};
  return read_manifest(path, ctx);
}

namespace {
// Opening runs the plugin's constructors (the first plugin code to run),
// then its entry point, negotiation and init.
std::shared_ptr<PluginLibrary> open_library(const std::string& path, const Manifest& manifest,
                                            const std::string& name, const ErrorContext& ctx) {
  auto library = std::make_shared<PluginLibrary>(path, manifest, ctx);
  maxdev_host_context init_ctx;
  init_ctx.plugin = &name;
  library->init(dispatch::host_api(), &init_ctx, ctx);
  return library;
}
}  // namespace

void PluginRegistry::trial_open(const std::string& path, const std::string& name) {
  const ErrorContext ctx{path, name};
  open_library(path, read_manifest(path, ctx), name, ctx)->close();
}

PluginRegistry::Plugin& PluginRegistry::find(const std::string& name, std::optional<uint64_t> id) {
  for (auto& p : plugins_) {
    if (p->name != name) continue;
    if (id && *id != p->id) {
      throw PluginError(ErrorKind::state, p->current->info.path, name, "",
                        "this handle names a load of the plugin that was unloaded; the plugin loaded under "
                        "this name now is a later load (get a handle for it with get_plugin())");
    }
    return *p;
  }
  throw PluginError(ErrorKind::state, "", name, "",
                    id ? "this handle's plugin was unloaded" : "no plugin of this name is loaded");
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
    auto check_abi_kinds = [&](const dispatch::OpSignature& sig) {
      const uint32_t needed = dispatch::abi_minor_needed(sig);
      if (manifest.abi_minor < needed) {
        ctx.fail(ErrorKind::schema,
                 "its arguments include a kind of value ABI " + std::to_string(manifest.abi_major) + "." +
                     std::to_string(needed) + " added (bool[]), but the plugin was built against ABI " +
                     std::to_string(manifest.abi_major) + "." + std::to_string(manifest.abi_minor) +
                     "; rebuild it against the current plugin_api",
                 k.op);
      }
    };
    auto check_servable = [&] {
      try {
        check_abi_kinds(OpTable::instance().check(k.op));
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
    const bool ours = std::any_of(custom_ops_.begin(), custom_ops_.end(), [&](const auto& c) { return c->name == k.op; });
    if (existing && ours && c10::toString(existing->schema()) == c10::toString(parsed)) {
      prepared.defined_before.push_back(k.op);  // this process already holds its definition
    }
    if (existing) {
      if (c10::toString(existing->schema()) != c10::toString(parsed)) {
        auto ours = std::find_if(custom_ops_.begin(), custom_ops_.end(),
                                 [&](const auto& c) { return c->name == k.op; });
        std::string hint;
        if (ours != custom_ops_.end()) {
          hint = " (defined by plugin '" + (*ours)->last_plugin +
                 "' in this process; a plugin-defined op keeps its schema for the life of the process, as Python may "
                 "hold it: give the changed op another name or overload, or restart the process)";
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
    check_abi_kinds(*plan.signature);
    prepared.to_define.push_back(&k);
  }

  if (checks.before_open) checks.before_open(version->snapshot.path);
  version->library = open_library(version->snapshot.path, manifest, name, ctx);

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

std::shared_ptr<PluginRegistry::Version> PluginRegistry::commit(Prepared prepared, int64_t generation) {
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
    std::lock_guard state(state_mutex_);
    custom_ops_.push_back(std::move(custom));
    v.info.defines.push_back(k->op);
  }
  v.info.defines.insert(v.info.defines.end(), prepared.defined_before.begin(), prepared.defined_before.end());
  auto owner = std::make_shared<dispatch::KernelOwner>();
  owner->plugin = v.info.name;
  owner->owner = v.info.name + "@" + v.info.version;
  owner->generation = generation;  // its kernels' profiler ranges name it
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
    discard_unpublished_ops();
    close_versions({version}, nullptr);
    throw;
  }
}

void PluginRegistry::discard_unpublished_ops() {
  std::vector<std::unique_ptr<CustomOp>> discarded;
  {
    std::lock_guard state(state_mutex_);
    for (auto c = custom_ops_.begin(); c != custom_ops_.end();) {
      if ((*c)->published) {
        ++c;
        continue;
      }
      discarded.push_back(std::move(*c));
      c = custom_ops_.erase(c);
    }
  }
  discarded.clear();  // destroys the definitions, outside the state lock
}

void PluginRegistry::update_custom_op_users() {
  std::lock_guard state(state_mutex_);
  for (auto& c : custom_ops_) {
    c->published = true;
    c->users.clear();
    for (const auto& p : plugins_) {
      auto serves = [&](const std::shared_ptr<Version>& v) {
        return std::find(v->info.ops.begin(), v->info.ops.end(), c->name) != v->info.ops.end();
      };
      if (serves(p->current) || std::any_of(p->previous.begin(), p->previous.end(), serves)) {
        c->users.insert(p->name);
        c->last_plugin = p->name;
        c->last_file = p->current->info.path;
      }
    }
    auto& slot = OpTable::instance().slot(c->name);
    if (c->users.empty()) {
      slot.set_unserved(c->last_plugin, c->last_file);
    } else {
      slot.set_unserved("", "");
    }
  }
}

void PluginRegistry::fold_counts(Plugin& plugin, const Version& version) {
  std::lock_guard state(state_mutex_);
  for (const auto& [op, provider] : version.providers) {
    Counts& h = plugin.history[op];
    h.calls += provider->calls.exchange(0, std::memory_order_relaxed);
    h.declines += provider->declines.exchange(0, std::memory_order_relaxed);
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
  ChangeLock lock(change_mutex_);
  Prepared prepared = prepare(path, name.value_or(""), /*new_plugin=*/true, options, checks);
  const auto started = prepared.started;
  auto plugin = std::make_unique<Plugin>();
  plugin->name = prepared.version->info.name;
  plugin->current = commit(std::move(prepared), plugin->next_generation);
  vet(checks, plugin->current, /*new_plugin=*/true);
  PluginInfo& info = plugin->current->info;
  info.id = plugin->id = next_plugin_id_++;
  info.generation = plugin->next_generation++;
  info.loaded_at_ns = now_ns();
  info.load_duration_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  {
    std::lock_guard state(state_mutex_);
    plugins_.push_back(std::move(plugin));
  }
  publish();
  update_custom_op_users();
  log::info("loaded plugin '" + info.name + "' " + info.version + " from " + path + " (" +
            std::to_string(info.ops.size()) + " ops, sha256 " + info.sha256.substr(0, 12) + ")");
  return info;
}

PluginInfo PluginRegistry::reload(const std::string& name, const ReloadOptions& options, const Checks& checks) {
  ChangeLock lock(change_mutex_);
  Plugin& plugin = find(name, options.id);
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
  std::shared_ptr<Version> fresh = commit(std::move(prepared), plugin.next_generation);
  vet(checks, fresh, /*new_plugin=*/false);
  PluginInfo& info = fresh->info;
  info.id = plugin.id;
  info.generation = plugin.next_generation++;
  info.loaded_at_ns = now_ns();
  info.load_duration_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  std::shared_ptr<Version> replaced = plugin.current;
  std::vector<std::shared_ptr<Version>> released;
  {
    std::lock_guard state(state_mutex_);
    plugin.previous.push_back(replaced);
    plugin.current = fresh;
    while (plugin.previous.size() > kKeptVersions) {
      released.push_back(plugin.previous.front());
      plugin.previous.pop_front();
    }
    info.previous_versions = static_cast<int64_t>(plugin.previous.size());
  }
  fold_counts(plugin, *replaced);
  update_custom_op_users();
  publish();
  fold_counts(plugin, *replaced);  // calls that were still running on it
  update_custom_op_users();
  close_versions(std::move(released), nullptr);
  log::info("reloaded plugin '" + name + "': " + plugin.previous.back()->info.version + " -> " + info.version +
            " (generation " + std::to_string(info.generation) + ", sha256 " + info.sha256.substr(0, 12) + ", " +
            std::to_string(info.load_duration_ns / 1000) + " us)");
  return info;
}

PluginInfo PluginRegistry::rollback(const std::string& name, std::optional<uint64_t> id) {
  ChangeLock lock(change_mutex_);
  Plugin& plugin = find(name, id);
  if (plugin.previous.empty()) {
    throw PluginError(ErrorKind::state, plugin.current->info.path, name, "",
                      "no previous version is still mapped to roll back to");
  }
  std::shared_ptr<Version> undone = plugin.current;
  {
    std::lock_guard state(state_mutex_);
    plugin.current = plugin.previous.back();
    plugin.previous.pop_back();
    plugin.current->info.previous_versions = static_cast<int64_t>(plugin.previous.size());
  }
  fold_counts(plugin, *undone);
  update_custom_op_users();
  publish();
  fold_counts(plugin, *undone);
  update_custom_op_users();
  close_versions({undone}, nullptr);  // a rolled-back version is not kept
  log::info("rolled back plugin '" + name + "': " + undone->info.version + " (generation " +
            std::to_string(undone->info.generation) + ") -> " + plugin.current->info.version + " (generation " +
            std::to_string(plugin.current->info.generation) + ")");
  return plugin.current->info;
}

UnloadReport PluginRegistry::unload(const std::string& name, std::optional<uint64_t> id) {
  ChangeLock lock(change_mutex_);
  Plugin& plugin = find(name, id);
  std::unique_ptr<Plugin> removed;
  {
    std::lock_guard state(state_mutex_);
    auto it = std::find_if(plugins_.begin(), plugins_.end(), [&](const auto& p) { return p.get() == &plugin; });
    removed = std::move(*it);
    plugins_.erase(it);
  }
  update_custom_op_users();  // before publish: a call that no longer finds it names the plugin
  publish();  // returns once no call can reach the plugin
  UnloadReport report{name, true};
  std::vector<std::shared_ptr<Version>> versions(removed->previous.begin(), removed->previous.end());
  versions.push_back(removed->current);
  close_versions(std::move(versions), &report.unmapped);
  log::info("unloaded plugin '" + name + "'" + (report.unmapped ? "" : " (its library is still mapped)"));
  return report;
}

uint64_t PluginRegistry::push_override(const std::string& op, std::shared_ptr<dispatch::Provider> provider) {
  ChangeLock lock(change_mutex_);
  try {
    OpTable::instance().slot(op);
  } catch (const std::invalid_argument& e) {
    throw PluginError(ErrorKind::schema, "", "", op, std::string("cannot be overridden: ") + e.what());
  }
  const uint64_t token = next_token_++;
  {
    std::lock_guard state(state_mutex_);
    overrides_.push_back({token, op, std::move(provider)});
  }
  publish();
  return token;
}

bool PluginRegistry::remove_override(uint64_t token) {
  ChangeLock lock(change_mutex_);
  const auto removed = take_overrides([&](const Override& o) { return o.token == token; });
  if (removed.empty()) return false;
  publish();
  return true;
}

std::vector<PluginRegistry::Override> PluginRegistry::take_overrides(
    const std::function<bool(const Override&)>& drop) {
  std::vector<Override> taken;
  std::lock_guard state(state_mutex_);
  for (auto it = overrides_.begin(); it != overrides_.end();) {
    if (drop(*it)) {
      taken.push_back(std::move(*it));
      it = overrides_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

size_t PluginRegistry::restore(const std::string& op) {
  ChangeLock lock(change_mutex_);
  const auto removed = take_overrides([&](const Override& o) { return o.op == op; });
  if (!removed.empty()) publish();
  return removed.size();  // the providers go after the last call that could use them
}

size_t PluginRegistry::remove_all_overrides() {
  ChangeLock lock(change_mutex_);
  const auto removed = take_overrides([](const Override&) { return true; });
  if (!removed.empty()) publish();
  return removed.size();
}

namespace {
PluginInfo listed(const PluginInfo& info, int64_t previous_versions, int64_t in_flight) {
  PluginInfo out = info;
  out.previous_versions = previous_versions;
  out.calls_in_flight = in_flight;
  return out;
}
}  // namespace

std::vector<PluginInfo> PluginRegistry::plugins() const {
  std::lock_guard state(state_mutex_);
  std::vector<PluginInfo> out;
  for (const auto& p : plugins_) {
    out.push_back(listed(p->current->info, static_cast<int64_t>(p->previous.size()),
                         p->current->owner->in_flight.load(std::memory_order_relaxed)));
  }
  return out;
}

std::optional<PluginInfo> PluginRegistry::plugin(uint64_t id) const {
  std::lock_guard state(state_mutex_);
  for (const auto& p : plugins_) {
    if (p->id == id) {
      return listed(p->current->info, static_cast<int64_t>(p->previous.size()),
                    p->current->owner->in_flight.load(std::memory_order_relaxed));
    }
  }
  return std::nullopt;
}

std::vector<OpReport> PluginRegistry::ops() const {
  std::map<std::string, int64_t> fallbacks;
  for (const auto& [op, n] : dispatch::fallback_counts()) fallbacks[op] = n;
  std::lock_guard state(state_mutex_);
  // The stacks as published, from the registry's own lists (the same
  // order build_table gives the dispatcher), with each plugin's history.
  std::map<size_t, std::vector<OpLayer>> stacks;  // by slot index
  auto layer = [](const dispatch::Provider& p, const Counts& before) {
    const int64_t calls = p.calls.load(std::memory_order_relaxed);
    const int64_t declines = p.declines.load(std::memory_order_relaxed);
    return OpLayer{p.owner(), p.kind(), before.calls + calls, before.declines + declines, calls, declines};
  };
  for (const auto& p : plugins_) {
    for (const auto& [op, provider] : p->current->providers) {
      const auto h = p->history.find(op);
      stacks[OpTable::instance().slot(op).index].push_back(
          layer(*provider, h == p->history.end() ? Counts{} : h->second));
    }
  }
  for (const auto& o : overrides_) stacks[OpTable::instance().slot(o.op).index].push_back(layer(*o.provider, {}));
  std::vector<OpReport> out;
  for (const auto* slot : OpTable::instance().slots()) {
    auto it = stacks.find(slot->index);
    if (it == stacks.end()) continue;
    out.push_back({slot->name, std::move(it->second), fallbacks.count(slot->name) ? fallbacks[slot->name] : 0,
                   slot->unboxed});
  }
  return out;
}

}  // namespace maxdev::plugins
