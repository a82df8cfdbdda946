// Private snapshots of plugin files.
//
// The loader never dlopens a user's path: dlopen matches an already loaded
// path and returns the old image even after a rebuild, and a file rewritten
// in place while mapped crashes the process. Instead the file is copied
// (and hashed while copying) into a directory only this process's user can
// enter, then renamed into place, and the copy is what gets opened.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "plugins/errors.h"
#include "plugins/trust.h"

namespace maxdev::plugins {

struct Snapshot {
  std::string path;    // the private copy
  std::string sha256;  // of the bytes copied (hex)
  uint64_t size = 0;
};

// Copies `source` into this process's snapshot directory, reading the one
// descriptor open_plugin_file() checked under `policy`. Throws PluginError
// (not_found, untrusted) as open_plugin_file() does; busy when a process
// holds the file open for writing before or after the copy, or it changed
// while copied (an unfinished build is never snapshotted); snapshot when
// the directory cannot be used or written (ENOSPC, read-only, missing).
Snapshot take_snapshot(const std::string& source, TrustPolicy policy, const ErrorContext& ctx);

// Removes a snapshot file (its mapping, if any, stays valid).
void remove_snapshot(const Snapshot& snapshot);

// This process's snapshot directory (mode 0700), created on first use and
// removed at exit by the process that created it (a forked child makes its
// own). It is <base>/max_device-<uid>/<pid namespace>-<pid>; base:
// $MAX_DEVICE_SNAPSHOT_DIR, else $TMPDIR, else /tmp. Creating it first runs
// remove_stale_snapshots() and empties a directory of this pid left by an
// earlier process (or by this one before an exec). Throws PluginError
// (snapshot) naming the directory when it cannot be made, is not private,
// or is on a noexec mount.
const std::string& snapshot_directory();

// Removes this process's snapshot directory now, if this process made one
// (a forked pre-flight child, which ends with _exit and runs no destructors).
void remove_own_snapshot_directory();

// Removes the snapshot directories that processes of this user left behind
// when they died without cleaning up (killed, crashed, os._exit): those of
// this pid namespace whose pid no longer exists. Directories of live processes and of other pid namespaces (whose pids
// cannot be checked from here) are kept. Returns how many were removed.
size_t remove_stale_snapshots();

}  // namespace maxdev::plugins
