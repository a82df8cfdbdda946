// Reload plugins when their files are rebuilt.
//
// Watches a directory (never a single inode: linkers delete and recreate,
// or write a temporary file and rename it into place) with inotify. A file
// that was written and closed, or renamed into place, is reloaded once it
// has kept the same size for the debounce interval and reads as a complete
// plugin (ELF with its manifest); a half-written file is never loaded, and a
// broken build is reported while the current version keeps serving.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace maxdev::plugins {

struct WatchEvent {
  std::string file;
  std::string plugin;
  bool reloaded = false;  // false: refused (the message says why) or unchanged
  std::string message;
};

class Watcher {
 public:
  // `target`: a plugin file (its directory is watched, for that file) or a
  // directory (every loaded plugin whose file is in it). Throws
  // std::runtime_error if it cannot be watched.
  Watcher(const std::string& target, std::chrono::milliseconds debounce);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  void stop();
  std::vector<WatchEvent> events() const;  // what happened so far, oldest first

 private:
  void run();
  void settle(const std::string& name);

  std::string directory_;
  std::string only_file_;  // empty: every file of the directory
  std::chrono::milliseconds debounce_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stop() signals
  std::thread thread_;
  mutable std::mutex events_mutex_;
  std::vector<WatchEvent> events_;
};

}  // namespace maxdev::plugins
