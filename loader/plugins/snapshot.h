// Private snapshots of plugin files.
//
// The loader never dlopens a user's path: dlopen matches an already loaded
// path and returns the old image even after a rebuild, and a file rewritten
// in place while mapped crashes the process. Instead the file is copied
// (and hashed while copying) into a directory only this process's user can
// enter, then renamed into place, and the copy is what gets opened.
#pragma once

#include <cstdint>
#include <string>

#include "plugins/errors.h"

namespace maxdev::plugins {

struct Snapshot {
  std::string path;    // the private copy
  std::string sha256;  // of the bytes copied (hex)
  uint64_t size = 0;
};

// Copies `source` into this process's snapshot directory. Throws
// PluginError(not_found) when `source` is missing, unreadable or not a
// regular file.
Snapshot take_snapshot(const std::string& source, const ErrorContext& ctx);

// Removes a snapshot file (its mapping, if any, stays valid).
void remove_snapshot(const Snapshot& snapshot);

// This process's snapshot directory (mode 0700), created on first use and
// removed at exit. Base: $MAX_DEVICE_SNAPSHOT_DIR, else $TMPDIR, else /tmp.
const std::string& snapshot_directory();

}  // namespace maxdev::plugins
