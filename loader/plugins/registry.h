// Loading and unloading plugins, all or nothing.
//
// load: snapshot -> manifest -> open + negotiate -> check every op ->
// define custom ops -> init -> publish (one table swap). Until publish
// nothing is visible; any failure undoes what this load created.
// unload: publish a table without the plugin, wait until no call can see
// it, remove the custom ops only it served, teardown, dlclose, verify.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "plugins/manifest.h"

namespace maxdev::plugins {

struct PluginInfo {
  std::string name;
  std::string version;
  std::string path;      // what the user asked to load
  std::string snapshot;  // the private copy that is mapped
  std::string sha256;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<std::string> ops;      // every op it serves
  std::vector<std::string> defines;  // ops it defines (schemas in its namespace)
  int64_t loaded_at_ns = 0;          // wall clock
  int64_t load_duration_ns = 0;
};

struct UnloadReport {
  std::string name;
  bool unmapped = true;  // the image really left the process
};

struct OpLayer {
  std::string owner;  // "reference@1.0.0"
  std::string kind;   // "plugin"
  int64_t calls = 0;
  int64_t declines = 0;
};

struct OpReport {
  std::string op;
  std::vector<OpLayer> layers;  // bottom to top; the top is active
  int64_t fallbacks = 0;        // calls that fell through to the CPU
};

class PluginRegistry {
 public:
  static PluginRegistry& instance();

  PluginInfo load(const std::string& path, const std::optional<std::string>& name);
  UnloadReport unload(const std::string& name);
  std::vector<PluginInfo> plugins() const;
  std::vector<OpReport> ops() const;

  // The manifest of a file, without loading it (no plugin code runs).
  static Manifest inspect(const std::string& path);

 private:
  struct Loaded;
  struct CustomOp;
  PluginRegistry();
  ~PluginRegistry();

  mutable std::mutex mutex_;  // serializes writers; readers of the listing
  std::vector<std::shared_ptr<Loaded>> loaded_;  // load order: later on top
  std::vector<std::unique_ptr<CustomOp>> custom_ops_;
};

}  // namespace maxdev::plugins
