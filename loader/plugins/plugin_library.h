// One opened plugin image: Boost.DLL handle, entry point, negotiated ABI,
// the plugin's definition checked against its manifest, init/teardown.
// Knows nothing of PyTorch.
#pragma once

#include <max_device/plugin.h>

#include <boost/dll/shared_library.hpp>
#include <string>
#include <vector>

#include "plugins/errors.h"
#include "plugins/manifest.h"

namespace maxdev::plugins {

class PluginLibrary {
 public:
  // Opens `snapshot_path` (RTLD_NOW | RTLD_LOCAL; this runs the library's
  // constructors), calls the entry point, negotiates the ABI and checks the
  // definition against `manifest`. Throws PluginError.
  PluginLibrary(const std::string& snapshot_path, const Manifest& manifest, const ErrorContext& ctx);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const maxdev_plugin_def& def() const { return *def_; }
  // The kernel table at this host's struct size (fields an older plugin
  // lacks are zero).
  const std::vector<maxdev_kernel_def>& kernels() const { return kernels_; }
  uint32_t abi_minor() const { return def_->abi_minor; }

  // Runs the plugin's init, if any. Throws PluginError on failure.
  void init(const maxdev_host_api* host, maxdev_host_context* ctx, const ErrorContext& err);
  void* state() const { return state_; }

  // Runs teardown (if init ran) and unloads the image. Returns whether the
  // image really left the process (dlclose is a no-op while e.g. GNU unique
  // symbols or thread_local destructors of the library are alive).
  bool close();

 private:
  void read_kernels(const ErrorContext& ctx);
  void check_definition(const Manifest& manifest, const ErrorContext& ctx) const;

  std::string path_;
  boost::dll::shared_library library_;
  const maxdev_plugin_def* def_ = nullptr;
  std::vector<maxdev_kernel_def> kernels_;
  void* state_ = nullptr;
  bool initialized_ = false;
};

}  // namespace maxdev::plugins
