#include "plugins/registry.h"

#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <set>

#include "common/log.h"
#include "dispatch/host_api.h"
#include "dispatch/kernel_provider.h"
#include "dispatch/op_table.h"
#include "plugins/plugin_library.h"
#include "plugins/snapshot.h"

namespace maxdev::plugins {

using dispatch::OpTable;

struct PluginRegistry::Loaded {
  PluginInfo info;
  Snapshot snapshot;
  std::shared_ptr<PluginLibrary> library;
  std::shared_ptr<dispatch::KernelOwner> owner;
  // (slot index, provider) for every kernel, in definition order.
  std::vector<std::pair<size_t, std::shared_ptr<dispatch::Provider>>> providers;
};

// An op a plugin defined: its schema lives as long as some plugin serves it.
struct PluginRegistry::CustomOp {
  std::string name;    // "myplug::rms_norm"
  std::string schema;  // as the plugin wrote it
  std::unique_ptr<torch::Library> definition;
  std::set<std::string> users;  // plugins serving it
};

namespace {

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

bool namespace_has_foreign_ops(const std::string& ns, const std::set<std::string>& ours) {
  const std::string prefix = ns + "::";
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind(prefix, 0) == 0 && ours.count(qualified(name)) == 0) return true;
  }
  return false;
}

}  // namespace

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

PluginInfo PluginRegistry::load(const std::string& path, const std::optional<std::string>& name) {
  std::lock_guard lock(mutex_);
  const auto started = std::chrono::steady_clock::now();
  ErrorContext ctx{path, ""};

  Snapshot snapshot = take_snapshot(path, ctx);
  struct SnapshotGuard {
    Snapshot* snap;
    ~SnapshotGuard() {
      if (snap) remove_snapshot(*snap);
    }
  } snapshot_guard{&snapshot};

  Manifest manifest = read_manifest(snapshot.path, ctx);
  ctx.plugin = name.value_or(manifest.name);
  static const std::regex kName("[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}");
  if (!std::regex_match(ctx.plugin, kName)) {
    ctx.fail(ErrorKind::manifest, "plugin name must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  for (const auto& l : loaded_) {
    if (l->info.name == ctx.plugin) {
      ctx.fail(ErrorKind::state, "a plugin named '" + ctx.plugin +
                                     "' is already loaded; unload it first or load with another name=");
    }
  }

  // Every op is checked before anything is registered.
  std::set<std::string> seen;
  std::vector<const KernelManifest*> to_define;
  for (const auto& k : manifest.kernels) {
    if (!seen.insert(k.op).second) ctx.fail(ErrorKind::manifest, "the plugin lists this op twice", k.op);
    const auto sep = k.op.find("::");
    if (sep == std::string::npos || sep == 0) {
      ctx.fail(ErrorKind::schema, "op names are 'namespace::name[.overload]'", k.op);
    }
    const std::string ns = k.op.substr(0, sep);
    if (k.schema.empty()) {
      try {
        OpTable::instance().check(k.op);
      } catch (const std::invalid_argument& e) {
        ctx.fail(ErrorKind::schema, e.what(), k.op);
      }
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
    auto ours = std::find_if(custom_ops_.begin(), custom_ops_.end(),
                             [&](const auto& c) { return c->name == k.op; });
    if (existing) {
      if (c10::toString(existing->schema()) != c10::toString(parsed)) {
        ctx.fail(ErrorKind::schema,
                 "schema '" + k.schema + "' contradicts the registered schema '" +
                     c10::toString(existing->schema()) +
                     "'" + (ours != custom_ops_.end() ? " (defined by plugin '" + *(*ours)->users.begin() +
                                                            "'; unload it first to change the schema)"
                                                      : ""),
                 k.op);
      }
      try {
        OpTable::instance().check(k.op);
      } catch (const std::invalid_argument& e) {
        ctx.fail(ErrorKind::schema, e.what(), k.op);
      }
      continue;
    }
    if (kReservedNamespaces.count(ns) != 0) {
      ctx.fail(ErrorKind::schema, "namespace '" + ns + "' belongs to PyTorch; define ops in your own namespace", k.op);
    }
    std::set<std::string> ours_names;
    for (const auto& c : custom_ops_) ours_names.insert(c->name);
    if (namespace_has_foreign_ops(ns, ours_names)) {
      ctx.fail(ErrorKind::schema, "namespace '" + ns + "' already holds ops registered outside max_device", k.op);
    }
    auto plan = dispatch::plan_signature(parsed);
    if (!plan.signature) ctx.fail(ErrorKind::schema, "cannot be served by a plugin: " + plan.why_not, k.op);
    to_define.push_back(&k);
  }

  // Opening runs the plugin's constructors: the first plugin code to run.
  auto library = std::make_shared<PluginLibrary>(snapshot.path, manifest, ctx);

  maxdev_host_context init_ctx;
  init_ctx.plugin = &ctx.plugin;
  library->init(dispatch::host_api(), &init_ctx, ctx);

  auto loaded = std::make_shared<Loaded>();
  loaded->snapshot = snapshot;
  loaded->library = library;
  auto owner = std::make_shared<dispatch::KernelOwner>();
  owner->plugin = ctx.plugin;
  owner->owner = ctx.plugin + "@" + manifest.version;
  owner->file = path;
  owner->state = library->state();
  owner->keep_alive = library;
  loaded->owner = owner;

  // From here on nothing can fail for a reason of the plugin's making.
  for (const KernelManifest* k : to_define) {
    auto custom = std::make_unique<CustomOp>();
    custom->name = k->op;
    custom->schema = k->schema;
    const auto ns = k->op.substr(0, k->op.find("::"));
    custom->definition = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt,
                                                          __FILE__, __LINE__);
    custom->definition->def(k->schema.c_str());
    custom_ops_.push_back(std::move(custom));
  }
  auto table = OpTable::instance().copy_current();
  const auto& def = library->def();
  for (int64_t i = 0; i < def.num_kernels; ++i) {
    const maxdev_kernel_def& kernel = def.kernels[i];
    dispatch::OpSlot& slot = OpTable::instance().slot(kernel.op);
    if (table->stacks.size() <= slot.index) table->stacks.resize(slot.index + 1);
    auto provider = std::make_shared<dispatch::KernelProvider>(owner, kernel);
    table->stacks[slot.index].push_back(provider);
    loaded->providers.emplace_back(slot.index, provider);
    loaded->info.ops.push_back(kernel.op);
    for (auto& c : custom_ops_) {
      if (c->name == kernel.op) c->users.insert(ctx.plugin);
    }
  }
  for (const KernelManifest* k : to_define) loaded->info.defines.push_back(k->op);
  OpTable::instance().publish(std::move(table));

  snapshot_guard.snap = nullptr;  // the snapshot now belongs to the loaded plugin
  PluginInfo& info = loaded->info;
  info.name = ctx.plugin;
  info.version = manifest.version;
  info.path = path;
  info.snapshot = snapshot.path;
  info.sha256 = snapshot.sha256;
  info.abi_major = manifest.abi_major;
  info.abi_minor = manifest.abi_minor;
  info.loaded_at_ns = now_ns();
  info.load_duration_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - started)
                              .count();
  loaded_.push_back(loaded);
  log::info("loaded plugin '" + info.name + "' " + info.version + " from " + path + " (" +
            std::to_string(info.ops.size()) + " ops, sha256 " + info.sha256.substr(0, 12) + ")");
  return info;
}

UnloadReport PluginRegistry::unload(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(loaded_.begin(), loaded_.end(), [&](const auto& l) { return l->info.name == name; });
  if (it == loaded_.end()) {
    throw PluginError(ErrorKind::state, "", name, "", "no plugin of this name is loaded");
  }
  std::shared_ptr<Loaded> loaded = *it;

  auto table = OpTable::instance().copy_current();
  for (const auto& [index, provider] : loaded->providers) {
    auto& stack = table->stacks[index];
    stack.erase(std::remove(stack.begin(), stack.end(), provider), stack.end());
  }
  OpTable::instance().publish(std::move(table));  // returns once no call can reach the plugin
  loaded_.erase(it);

  for (auto c = custom_ops_.begin(); c != custom_ops_.end();) {
    (*c)->users.erase(name);
    if ((*c)->users.empty()) {
      OpTable::instance().retire((*c)->name);
      c = custom_ops_.erase(c);  // destroys the definition
    } else {
      ++c;
    }
  }

  UnloadReport report{name, true};
  loaded->providers.clear();
  loaded->owner.reset();
  report.unmapped = loaded->library->close();
  remove_snapshot(loaded->snapshot);
  if (report.unmapped) {
    log::info("unloaded plugin '" + name + "'");
  } else {
    log::warn("unloaded plugin '" + name + "', but its library is still mapped (" + loaded->info.snapshot +
              "): it holds GNU unique symbols or thread_local destructors; its code stays in memory");
  }
  return report;
}

std::vector<PluginInfo> PluginRegistry::plugins() const {
  std::lock_guard lock(mutex_);
  std::vector<PluginInfo> out;
  for (const auto& l : loaded_) out.push_back(l->info);
  return out;
}

std::vector<OpReport> PluginRegistry::ops() const {
  std::lock_guard lock(mutex_);
  std::vector<OpReport> out;
  const auto* table = OpTable::instance().current();
  for (const auto* slot : OpTable::instance().slots()) {
    OpReport report;
    report.op = slot->name;
    report.fallbacks = slot->fallbacks.load();
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
