// Loading, reloading and unloading plugins, and Python overrides, all or
// nothing.
//
// Every change prepares what it needs (snapshot -> manifest -> checks ->
// open + negotiate -> init), then publishes one new dispatch table built
// from the plugins in load order (later on top) and the overrides above
// them. Until publish nothing is visible; any failure before it undoes what
// the change created. Versions a change retires are released once no call
// can still be inside them; a reload keeps the previous versions mapped for
// rollback().
//
// Two locks: changes are serialized by one, held for a whole change
// (checks, dlopen, waiting for calls in flight); the registry's lists are
// guarded by another, held only for moments and never while waiting, so
// a listing (from a Python override inside a call, say) never waits on a
// change that waits on it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "plugins/manifest.h"

namespace maxdev::dispatch {
class Provider;
struct DispatchTable;
}

namespace maxdev::plugins {

struct PluginInfo {
  uint64_t id = 0;       // this load of the plugin (a reload keeps it; unload + load gets a new one)
  std::string name;
  std::string version;
  std::string path;      // what the user asked to load (last reload's path)
  std::string origin;    // how that path was found: "path", or the search path entry
  std::string snapshot;  // the private copy that is mapped
  std::string sha256;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<std::string> ops;      // every op it serves
  std::vector<std::string> defines;  // ops it defines (schemas in its namespace)
  int64_t generation = 0;            // 1 at load, +1 per reload that published
  int64_t loaded_at_ns = 0;          // wall clock, when this version was published
  int64_t load_duration_ns = 0;      // snapshot to publish, for this version
  int64_t previous_versions = 0;     // older versions still mapped (rollback targets)
  int64_t calls_in_flight = 0;       // kernel calls of this version running now
  bool allow_untrusted = false;      // loaded with the trust checks waived
  bool allow_composite = false;      // kernels on CompositeImplicitAutograd ops accepted (forward only)
};

struct UnloadReport {
  std::string name;
  bool unmapped = true;  // every image of the plugin really left the process
};

struct OpLayer {
  std::string owner;  // "reference@1.0.0", "override:<name>"
  std::string kind;   // "plugin", "override"
  // Since the plugin was loaded, over all its versions (an override: since
  // it was installed). Validation runs of a version not yet live never count.
  int64_t calls = 0;
  int64_t declines = 0;
  // The serving version only, since it became current.
  int64_t version_calls = 0;
  int64_t version_declines = 0;
};

struct OpReport {
  std::string op;
  std::vector<OpLayer> layers;  // bottom to top; the top is tried first
  int64_t fallbacks = 0;        // calls that fell through to the CPU
  bool unboxed = false;         // its trampoline is called unboxed (dispatch/trampoline.h)
};

// Checks a change runs before it becomes visible; either may throw to
// refuse the change, which then leaves everything as it was.
struct Checks {
  // With the private snapshot that will be opened, before it is opened
  // (e.g. trying it in a child process first).
  std::function<void(const std::string& snapshot_path)> before_open;
  // After the new version is ready, before it is published; calls on this
  // thread (only) already see it.
  std::function<void(const std::vector<std::string>& ops)> before_publish;
};

// How a plugin file is accepted. Every refusal is a PluginError and
// changes nothing.
struct LoadOptions {
  std::string origin = "path";        // how the path was found; listed in PluginInfo
  std::optional<std::string> sha256;  // pinned content (lowercase hex): anything else is refused
  bool allow_untrusted = false;       // waive the ownership and permission checks (trust.h)
  bool allow_composite = false;       // accept kernels on CompositeImplicitAutograd ops (dispatch_kind.h)
};

struct ReloadOptions {
  std::optional<uint64_t> id;       // the load a handle names: refused if the plugin is another load
  std::optional<std::string> path;  // default: the path of the current version
  bool force = false;               // reload even if the content is unchanged
  // Default: the current version's when the path is the current one's,
  // else "path".
  std::optional<std::string> origin;
  std::optional<std::string> sha256;     // pinned content, as in LoadOptions
  std::optional<bool> allow_untrusted;   // default: as the current version was loaded
  std::optional<bool> allow_composite;   // default: as the current version was loaded
};

class PluginRegistry {
 public:
  static PluginRegistry& instance();

  PluginInfo load(const std::string& path, const std::optional<std::string>& name, const Checks& checks = {},
                  const LoadOptions& options = {});
  // Replaces the plugin's current version with a new build, atomically.
  // Unchanged content (same SHA-256) is a no-op unless forced.
  PluginInfo reload(const std::string& name, const ReloadOptions& options, const Checks& checks = {});
  // Returns to the previous version (still mapped).
  PluginInfo rollback(const std::string& name, std::optional<uint64_t> id = std::nullopt);
  // `id`: the load a handle names; another load of the same name is refused.
  UnloadReport unload(const std::string& name, std::optional<uint64_t> id = std::nullopt);
  std::vector<PluginInfo> plugins() const;
  std::optional<PluginInfo> plugin(uint64_t id) const;  // nullopt once that load was unloaded
  std::vector<OpReport> ops() const;

  // A provider above every plugin for `op`; returns a token for removal.
  uint64_t push_override(const std::string& op, std::shared_ptr<dispatch::Provider> provider);
  // Removes one override (false if the token is unknown).
  bool remove_override(uint64_t token);
  // Removes every override of `op`; returns how many.
  size_t restore(const std::string& op);
  // Removes every override (at interpreter exit, while Python still runs).
  size_t remove_all_overrides();

  // The manifest of a file, without loading it (no plugin code runs).
  static Manifest inspect(const std::string& path);

  // Opens, initializes and closes a plugin file without registering
  // anything: the pre-flight child's test. Throws PluginError.
  static void trial_open(const std::string& path, const std::string& name);

  // In a child forked from inside a change's check (the pre-flight child,
  // which is a copy of this process made while the change held its lock):
  // drops that change so the child can make its own. Nothing else may call it.
  void abandon_change_after_fork();

 private:
  struct Version;
  struct Plugin;
  struct Override;
  struct CustomOp;
  struct Prepared;
  struct Counts {
    int64_t calls = 0, declines = 0;
  };
  PluginRegistry();
  ~PluginRegistry();
  static void before_fork();
  static void after_fork_in_parent();
  static void after_fork_in_child();

  // `name`: empty for the manifest's; a new plugin's name must be free.
  Prepared prepare(const std::string& path, const std::string& name, bool new_plugin, const LoadOptions& options,
                   const Checks& checks);
  std::shared_ptr<Version> commit(Prepared prepared, int64_t generation);
  // Runs checks.before_publish with `candidate` staged on this thread;
  // on failure undoes commit(version) and rethrows.
  void vet(const Checks& checks, const std::shared_ptr<Version>& version, bool new_plugin);
  std::unique_ptr<dispatch::DispatchTable> build_table(const Version* replacing, const Version* with) const;
  void publish();  // callers hold change_mutex_, not state_mutex_
  // Removes the custom ops a refused change defined (never published).
  void discard_unpublished_ops();
  // After a change: which plugins serve each custom op; an op nobody
  // serves any more raises an error naming its last plugin.
  void update_custom_op_users();
  // Removes the overrides `drop` selects from the list (not yet from the table).
  std::vector<Override> take_overrides(const std::function<bool(const Override&)>& drop);
  // Moves a version's counters into its plugin's history (it stops serving).
  void fold_counts(Plugin& plugin, const Version& version);
  void close_versions(std::vector<std::shared_ptr<Version>> versions, bool* all_unmapped);
  Plugin& find(const std::string& name, std::optional<uint64_t> id = std::nullopt);

  std::mutex change_mutex_;           // serializes changes (held for a whole change)
  mutable std::mutex state_mutex_;    // guards the lists below; held only for moments
  std::vector<std::unique_ptr<Plugin>> plugins_;  // load order: later on top
  std::vector<Override> overrides_;               // push order: later on top
  std::vector<std::unique_ptr<CustomOp>> custom_ops_;
  uint64_t next_token_ = 1;
  uint64_t next_plugin_id_ = 1;
};

}  // namespace maxdev::plugins
