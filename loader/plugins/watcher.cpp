#include "plugins/watcher.h"

#include <fnmatch.h>
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
#include "plugins/file_writers.h"
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

Watcher::Watcher(const std::string& target, std::chrono::milliseconds debounce, std::string pattern,
                 OnReady on_ready)
    : pattern_(std::move(pattern)), debounce_(debounce), on_ready_(std::move(on_ready)), owner_(::getpid()) {
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
      ::inotify_add_watch(inotify_fd_, directory_.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
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
  if (owner_ != ::getpid()) {
    thread_.detach();  // a forked child: the watching thread stayed in the parent
    return;
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

bool Watcher::is_candidate(const std::string& name) const {
  const std::string path = directory_ + "/" + name;
  if (!only_file_.empty()) return path == only_file_;
  if (!pattern_.empty() && ::fnmatch(pattern_.c_str(), name.c_str(), 0) == 0) return true;
  for (const auto& info : PluginRegistry::instance().plugins()) {
    if (canonical(info.path) == path) return true;
  }
  return false;
}

void Watcher::run() {
  struct Pending {
    Clock::time_point last_event;
    struct stat at_event {};  // the file when the kernel said it was closed or moved in
    bool stat_ok = false;
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
          if (ev->len == 0 || (ev->mask & IN_ISDIR) || !is_candidate(ev->name)) continue;
          Pending& entry = pending[ev->name];
          entry.last_event = now;
          entry.stat_ok = ::stat((directory_ + "/" + ev->name).c_str(), &entry.at_event) == 0;
        }
      }
    }
    for (auto it = pending.begin(); it != pending.end();) {
      Pending& p = it->second;
      if (now - p.last_event < debounce_) {
        ++it;
        continue;
      }
      const std::string path = directory_ + "/" + it->first;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || !p.stat_ok) {
        log::debug("watch: " + path + " is gone or not a regular file; ignored");
        it = pending.erase(it);
        continue;
      }
      if (!same_content_stamp(st, p.at_event)) {  // written again since: wait for its close
        p.at_event = st;
        p.last_event = now;
        ++it;
        continue;
      }
      const auto writers = writers_of(st);
      if (!writers.empty()) {  // its writer's close will be another event
        log::debug("watch: " + path + " is still open for writing by " + describe(writers) + "; waiting");
        it = pending.erase(it);
        continue;
      }
      bool done = true;
      try {
        done = on_ready_(path);
      } catch (const std::exception& e) {
        log::error(std::string("watch: ") + path + ": " + e.what());
      }
      if (done) {
        it = pending.erase(it);
      } else {
        p.last_event = now;
        ++it;
      }
    }
  }
}

}  // namespace maxdev::plugins
