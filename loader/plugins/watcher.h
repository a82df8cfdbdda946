// Notices when plugin files have been rebuilt, and only when they are done.
//
// Watches a directory (never a single inode: linkers delete and recreate,
// or write a temporary file and rename it into place) with inotify. Only
// the kernel's "written and closed" (IN_CLOSE_WRITE) and "renamed into
// place" (IN_MOVED_TO) count: a file being written is never ready. A file
// is handed on once, after the debounce interval since its last event, it
// is a regular file that no process holds open for writing and whose size
// and times did not change since that event. Files that are not
// candidates (not a loaded plugin's file, nor matching the caller's
// pattern: CMakeCache.txt, .ninja_log, ...) are ignored silently.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace maxdev::plugins {

class Watcher {
 public:
  // Called on the watcher's thread with a ready file's path. Returns false
  // to be called again for it after another debounce interval (e.g. the
  // file turned out to be busy again).
  using OnReady = std::function<bool(const std::string& path)>;

  // `target`: a plugin file (its directory is watched, for that file) or a
  // directory (the files of loaded plugins in it, and those matching
  // `pattern`, a shell glob on file names, if not empty). Throws
  // std::runtime_error if it cannot be watched.
  Watcher(const std::string& target, std::chrono::milliseconds debounce, std::string pattern, OnReady on_ready);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Ends the watch; returns once no on_ready call is running.
  void stop();
  const std::string& directory() const { return directory_; }

 private:
  void run();
  bool is_candidate(const std::string& name) const;

  std::string directory_;
  std::string only_file_;  // empty: the directory's candidates
  std::string pattern_;
  std::chrono::milliseconds debounce_;
  OnReady on_ready_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stop() signals
  pid_t owner_ = 0;   // the process whose thread runs the watch (a forked child has none)
  std::thread thread_;
};

}  // namespace maxdev::plugins
