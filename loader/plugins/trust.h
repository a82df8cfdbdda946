// Which plugin files the loader agrees to read, and reading them safely.
//
// A plugin runs in this process, so its file must not be replaceable by
// another user: by default the file must be a regular file owned by this
// process's user or root and not writable by group or others, and so must
// its directory (except the sticky bit case, see trust.cpp). The file is
// opened once, relative to the directory that was checked, and the same
// descriptor is checked and copied: what is checked is what gets loaded.
#pragma once

#include <sys/stat.h>

#include <string>

#include "plugins/errors.h"

namespace maxdev::plugins {

enum class TrustPolicy {
  owner_only,       // refuse files others could have written (the default)
  allow_untrusted,  // the user opted in: skip the ownership and mode checks
};

// An open file descriptor, closed on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&&) = delete;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct PluginFile {
  UniqueFd fd;             // open for reading
  struct stat stat {};     // of fd
};

// Opens the plugin file at `path` for reading. Throws PluginError
// (not_found) when it is missing, unreadable or not a regular file, and
// (untrusted) when the policy refuses it; the message says how to opt in.
PluginFile open_plugin_file(const std::string& path, TrustPolicy policy, const ErrorContext& ctx);

}  // namespace maxdev::plugins
