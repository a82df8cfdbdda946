// Typed errors of plugin loading. Each names the file, the plugin and the
// op where there is one; Python maps each kind to a max_device.PluginError
// subclass.
#pragma once

#include <stdexcept>
#include <string>

namespace maxdev::plugins {

enum class ErrorKind {
  not_found,     // no such file, or not a regular file (a FIFO, a device, a directory)
  bad_image,     // not a loadable shared library for this machine
  abi_mismatch,  // ABI version the host does not accept
  manifest,      // manifest missing, corrupt or contradicting the entry point
  schema,        // op name or schema the dispatcher refuses
  state,         // wrong lifecycle request (unknown plugin, name taken, ...)
  untrusted,     // another user could have written the file or its directory
  hash_mismatch, // the content is not the SHA-256 the caller pinned
  busy,          // the file is still being written (a linker, a copy)
  snapshot,      // the private snapshot directory cannot be used
};

const char* error_kind_name(ErrorKind kind);

class PluginError : public std::runtime_error {
 public:
  PluginError(ErrorKind kind, std::string file, std::string plugin, std::string op,
              const std::string& detail)
      : std::runtime_error(compose(file, plugin, op, detail)),
        kind_(kind),
        file_(std::move(file)),
        plugin_(std::move(plugin)),
        op_(std::move(op)) {}

  ErrorKind kind() const { return kind_; }
  const std::string& file() const { return file_; }
  const std::string& plugin() const { return plugin_; }
  const std::string& op() const { return op_; }

 private:
  static std::string compose(const std::string& file, const std::string& plugin,
                             const std::string& op, const std::string& detail) {
    std::string where;
    if (!plugin.empty()) where += "plugin '" + plugin + "'";
    if (!op.empty()) where += std::string(where.empty() ? "" : ", ") + "op " + op;
    if (!file.empty()) where += std::string(where.empty() ? "" : " ") + "(" + file + ")";
    return where.empty() ? detail : where + ": " + detail;
  }

  ErrorKind kind_;
  std::string file_, plugin_, op_;
};

// Who an error is about; filled in as a load proceeds.
struct ErrorContext {
  std::string file;
  std::string plugin;

  [[noreturn]] void fail(ErrorKind kind, const std::string& detail,
                         const std::string& op = {}) const {
    throw PluginError(kind, file, plugin, op, detail);
  }
};

}  // namespace maxdev::plugins
