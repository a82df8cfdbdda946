#include "plugins/plugin_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/log.h"
#include "dispatch/host_api.h"

namespace maxdev::plugins {
namespace {

// Sizes of the structs at ABI 1.0: a plugin's structs may be larger (newer
// minor) but never smaller.
constexpr size_t kPluginDefSize_1_0 = sizeof(maxdev_plugin_def);
constexpr size_t kKernelDefSize_1_0 = offsetof(maxdev_kernel_def, flags) + sizeof(uint64_t);
// The frozen prefix read before anything else.
constexpr size_t kFrozenPrefix = offsetof(maxdev_plugin_def, abi_minor) + sizeof(uint32_t);

std::string version_text(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string checked_string(const char* s, const std::string& what, const ErrorContext& ctx) {
  if (s == nullptr) ctx.fail(ErrorKind::bad_image, what + " is NULL in the plugin definition");
  const size_t len = strnlen(s, 4096);
  if (len == 4096) ctx.fail(ErrorKind::bad_image, what + " is not a NUL-terminated string of at most 4095 bytes");
  return std::string(s, len);
}

// A string of the plugin's, safe to put in a message (which must be valid
// UTF-8 to reach Python): printable ASCII as is, other bytes as \xNN.
std::string quoted(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (const unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += std::string("\\x") + kHex[c >> 4] + kHex[c & 0xf];
    }
  }
  return out + "'";
}

}  // namespace

PluginLibrary::PluginLibrary(const std::string& snapshot_path, const Manifest& manifest, const ErrorContext& ctx)
    : path_(snapshot_path) {
  namespace dll = boost::dll;
  const dll::fs::path path(snapshot_path);
  dll::fs::error_code error;
  // An exception thrown by a plugin's static constructor escapes from inside
  // dlopen, whose frames cannot be unwound safely (glibc still holds its
  // loader lock). Whether it reached a handler here used to depend on how the
  // compiler laid out this function; noexcept makes it std::terminate always.
  [&]() noexcept { library_.load(path, dll::load_mode::rtld_now | dll::load_mode::rtld_local, error); }();
  if (error) {
    try {
      dll::detail::report_error(error, "boost::dll::shared_library::load() failed");  // with dlerror's text
    } catch (const std::exception& e) {
      ctx.fail(ErrorKind::bad_image, std::string("cannot load the library: ") + e.what());
    }
  }
  if (!library_.has(MAXDEV_ENTRY_SYMBOL)) {
    ctx.fail(ErrorKind::bad_image, "does not export the entry point " MAXDEV_ENTRY_SYMBOL);
  }
  auto& entry = library_.get<maxdev_status(const maxdev_host_api*, const maxdev_plugin_def**)>(MAXDEV_ENTRY_SYMBOL);
  const maxdev_plugin_def* def = nullptr;
  const maxdev_status status = entry(dispatch::host_api(), &def);
  if (status != MAXDEV_OK) {
    ctx.fail(ErrorKind::bad_image, "entry point " MAXDEV_ENTRY_SYMBOL " refused this host (status " +
                                       std::to_string(status) + ")");
  }
  if (def == nullptr) ctx.fail(ErrorKind::bad_image, "entry point returned no plugin definition");

  // Negotiation: the frozen prefix only, then the major, before any other field.
  if (def->struct_size < kFrozenPrefix) {
    ctx.fail(ErrorKind::abi_mismatch, "plugin definition is " + std::to_string(def->struct_size) +
                                          " bytes, too small to carry an ABI version");
  }
  const std::string host = version_text(MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR);
  if (def->abi_major != MAXDEV_ABI_MAJOR) {
    ctx.fail(ErrorKind::abi_mismatch, "plugin ABI " + version_text(def->abi_major, def->abi_minor) +
                                          " has another major version than this max_device's ABI " + host +
                                          "; rebuild the plugin against this max_device");
  }
  if (def->abi_minor > MAXDEV_ABI_MINOR) {
    ctx.fail(ErrorKind::abi_mismatch, "plugin ABI " + version_text(def->abi_major, def->abi_minor) +
                                          " is newer than this max_device's ABI " + host +
                                          "; upgrade max_device or build the plugin against ABI " + host);
  }
  if (def->struct_size < kPluginDefSize_1_0) {
    ctx.fail(ErrorKind::abi_mismatch, "plugin definition is " + std::to_string(def->struct_size) +
                                          " bytes; ABI " + version_text(def->abi_major, def->abi_minor) +
                                          " needs at least " + std::to_string(kPluginDefSize_1_0));
  }
  def_ = def;
  read_kernels(ctx);
  check_definition(manifest, ctx);
}

void PluginLibrary::read_kernels(const ErrorContext& ctx) {
  if (def_->num_kernels <= 0) return;
  if (def_->kernels == nullptr) ctx.fail(ErrorKind::bad_image, "plugin definition has kernels == NULL");
  // The plugin's array strides by its own sizeof(maxdev_kernel_def), which
  // an older minor has smaller: fields it lacks read as zero (absent).
  const size_t stride = def_->kernels[0].struct_size;
  if (stride < kKernelDefSize_1_0) {
    ctx.fail(ErrorKind::abi_mismatch, "kernel definition 0 is " + std::to_string(stride) +
                                          " bytes; needs at least " + std::to_string(kKernelDefSize_1_0));
  }
  const auto* base = reinterpret_cast<const char*>(def_->kernels);
  for (int64_t i = 0; i < def_->num_kernels; ++i) {
    const auto* raw = reinterpret_cast<const maxdev_kernel_def*>(base + static_cast<size_t>(i) * stride);
    if (raw->struct_size != stride) {
      ctx.fail(ErrorKind::abi_mismatch, "kernel definition " + std::to_string(i) + " is " +
                                            std::to_string(raw->struct_size) + " bytes where kernel 0 is " +
                                            std::to_string(stride));
    }
    maxdev_kernel_def k{};
    std::memcpy(&k, raw, std::min(stride, sizeof(k)));
    kernels_.push_back(k);
  }
}

void PluginLibrary::check_definition(const Manifest& manifest, const ErrorContext& ctx) const {
  const std::string name = checked_string(def_->name, "plugin name", ctx);
  const std::string version = checked_string(def_->version, "plugin version", ctx);
  auto disagree = [&](const std::string& what, const std::string& op = {}) {
    ctx.fail(ErrorKind::manifest, "the manifest and the entry point disagree on " + what, op);
  };
  if (name != manifest.name) disagree("the plugin name (" + quoted(manifest.name) + " vs " + quoted(name) + ")");
  if (version != manifest.version) {
    disagree("the version (" + quoted(manifest.version) + " vs " + quoted(version) + ")");
  }
  if (def_->abi_minor != manifest.abi_minor) disagree("the ABI version");
  if (def_->num_kernels < 0 || static_cast<size_t>(def_->num_kernels) != manifest.kernels.size()) {
    disagree("the number of kernels (" + std::to_string(manifest.kernels.size()) + " vs " +
             std::to_string(def_->num_kernels) + ")");
  }
  for (size_t i = 0; i < kernels_.size(); ++i) {
    const maxdev_kernel_def& k = kernels_[i];
    const KernelManifest& m = manifest.kernels[i];
    const std::string op = checked_string(k.op, "op name of kernel " + std::to_string(i), ctx);
    if (op != m.op) disagree("kernel " + std::to_string(i) + " (" + quoted(m.op) + " vs " + quoted(op) + ")");
    const std::string schema = k.schema == nullptr ? "" : checked_string(k.schema, "schema of " + op, ctx);
    if (schema != m.schema) disagree("the schema", op);
    if (k.dtypes != m.dtypes || k.flags != m.flags) disagree("the dtypes or flags", op);
    if (k.fn == nullptr) ctx.fail(ErrorKind::bad_image, "kernel function is NULL", op);
    if (k.backward != nullptr) checked_string(k.backward, "backward op of " + op, ctx);
  }
}

void PluginLibrary::init(const maxdev_host_api* host, maxdev_host_context* ctx, const ErrorContext& err) {
  if (def_->init == nullptr) return;
  const maxdev_status status = def_->init(host, ctx, &state_);
  if (status != MAXDEV_OK) {
    err.fail(ErrorKind::bad_image, "init failed: " + (ctx->error.empty() ? "(no message)" : ctx->error));
  }
  initialized_ = true;
}

bool PluginLibrary::close() {
  if (!library_.is_loaded()) return true;
  if (initialized_ && def_->teardown != nullptr) def_->teardown(state_);
  initialized_ = false;
  library_.unload();
  // RTLD_NOLOAD finds the image only if it is still mapped (and then adds a
  // reference, which must be dropped again).
  void* still = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (still == nullptr) return true;
  ::dlclose(still);
  return false;
}

PluginLibrary::~PluginLibrary() { close(); }

}  // namespace maxdev::plugins
