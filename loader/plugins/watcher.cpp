#include "plugins/watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "common/log.h"
#include "plugins/manifest.h"
#include "plugins/registry.h"

namespace maxdev::plugins {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


std::string canonical(const std::string& path) {
  std::error_code ec;
  auto c = fs::weakly_canonical(path, ec);
  return ec ? path : c.string();
}

}  // namespace

Watcher::Watcher(const std::string& target, std::chrono::milliseconds debounce) : debounce_(debounce) {
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    directory_ = canonical(target);
  } else {
    only_file_ = canonical(target);
    directory_ = fs::path(only_file_).parent_path().string();
  }
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (inotify_fd_ < 0 || wake_fd_ < 0 ||
      ::inotify_add_watch(inotify_fd_, directory_.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0) {
    const std::string why = std::strerror(errno);
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    throw std::runtime_error("cannot watch " + directory_ + ": " + why);
  }
  thread_ = std::thread([this] { run(); });
  log::info("watching " + (only_file_.empty() ? directory_ + "/" : only_file_) + " for rebuilt plugins");
}

Watcher::~Watcher() {
  stop();
  ::close(inotify_fd_);
  ::close(wake_fd_);
}

void Watcher::stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

std::vector<WatchEvent> Watcher::events() const {
  std::lock_guard lock(events_mutex_);
  return events_;
}

void Watcher::run() {
  struct Pending {
    Clock::time_point first_seen, last_change;
    off_t size = -1;
  };
  std::map<std::string, Pending> pending;  // file name in the directory -> state
  alignas(inotify_event) char buffer[8192];
  for (;;) {
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int timeout = pending.empty() ? -1 : static_cast<int>(debounce_.count() / 2 + 1);
    if (::poll(fds, 2, timeout) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) break;
    const auto now = Clock::now();
    if (fds[0].revents & POLLIN) {
      for (ssize_t n; (n = ::read(inotify_fd_, buffer, sizeof(buffer))) > 0;) {
        for (char* p = buffer; p < buffer + n;) {
          auto* ev = reinterpret_cast<inotify_event*>(p);
          p += sizeof(inotify_event) + ev->len;
          if (ev->len == 0 || (ev->mask & IN_ISDIR)) continue;
          const std::string name = ev->name;
          if (!only_file_.empty() && directory_ + "/" + name != only_file_) continue;
          auto [it, fresh] = pending.try_emplace(name, Pending{now, now, -1});
          it->second.last_change = now;
          (void)fresh;
        }
      }
    }
    // A file is ready when its size held still for the debounce interval.
    for (auto it = pending.begin(); it != pending.end();) {
      Pending& p = it->second;
      struct stat st {};
      const bool exists = ::stat((directory_ + "/" + it->first).c_str(), &st) == 0;
      if (!exists) {
        it = pending.erase(it);
        continue;
      }
      if (st.st_size != p.size) {
        p.size = st.st_size;
        p.last_change = now;
      }
      if (now - p.last_change < debounce_) {
        ++it;
        continue;
      }
      const std::string path = directory_ + "/" + it->first;
      try {
        read_manifest(path, ErrorContext{path, ""});  // complete ELF with a manifest?
      } catch (const std::exception& e) {
        // Maybe still being written: give it 20 debounce intervals (at least
        // a second) to become a complete plugin before reporting it.
        if (now - p.first_seen < std::max<Clock::duration>(std::chrono::seconds(1), 20 * debounce_)) {
          p.last_change = now;
          ++it;
          continue;
        }
        std::lock_guard lock(events_mutex_);
        events_.push_back({path, "", false, e.what()});
        log::error(std::string("watch: ") + e.what());
        it = pending.erase(it);
        continue;
      }
      settle(path);
      it = pending.erase(it);
    }
  }
}

void Watcher::settle(const std::string& path) {
  auto& registry = PluginRegistry::instance();
  for (const auto& info : registry.plugins()) {
    if (canonical(info.path) != path) continue;
    WatchEvent event{path, info.name, false, ""};
    try {
      ReloadOptions options;
      options.path = info.path;
      const auto after = registry.reload(info.name, options);
      event.reloaded = after.sha256 != info.sha256;
      event.message = event.reloaded ? "reloaded: " + info.version + " -> " + after.version + " (generation " +
                                           std::to_string(after.generation) + ")"
                                     : "unchanged";
    } catch (const std::exception& e) {
      event.message = e.what();  // the registry logged it; the current version keeps serving
    }
    std::lock_guard lock(events_mutex_);
    events_.push_back(std::move(event));
  }
}

}  // namespace maxdev::plugins
