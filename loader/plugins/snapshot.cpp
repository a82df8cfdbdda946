#include "plugins/snapshot.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <regex>
#include <vector>

#include "common/log.h"
#include "plugins/file_writers.h"
#include "plugins/sha256.h"

namespace maxdev::plugins {
namespace {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void fail_directory(const std::string& detail) {
  throw PluginError(ErrorKind::snapshot, "", "", "",
                    detail + " (plugins are copied there before they are opened; set MAX_DEVICE_SNAPSHOT_DIR "
                             "to a private, writable directory on a filesystem that allows execution)");
}

// Where the base directory comes from, for messages.
struct Base {
  std::string path;
  std::string source;  // "$MAX_DEVICE_SNAPSHOT_DIR", "$TMPDIR", "the default"
};

Base snapshot_base() {
  for (const char* variable : {"MAX_DEVICE_SNAPSHOT_DIR", "TMPDIR"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') return {value, std::string("$") + variable};
  }
  return {"/tmp", "the default"};
}

// Creates `dir` with mode 0700, or accepts it if it exists, is a directory
// (not a link), belongs to us and nobody else can enter it.
void ensure_private_dir(const std::string& dir, const Base& base) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    if (errno == ENOENT) {
      fail_directory("cannot create snapshot directory " + dir + ": the base directory " + base.path + " (from " +
                     base.source + ") does not exist");
    }
    fail_directory("cannot create snapshot directory " + dir + " under " + base.path + " (from " + base.source +
                   "): " + errno_text());
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    fail_directory("snapshot directory " + dir + " is not a private directory of this user (mode 0700); remove it");
  }
}

// The directory holding this user's per-process snapshot directories.
std::string user_directory(const Base& base) { return base.path + "/max_device-" + std::to_string(::geteuid()); }

// Identifies the pid namespace, so that pids are only compared with pids of
// the same namespace (containers sharing /tmp each have their own).
std::string pid_namespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);  // "pid:[4026531836]"
  const std::string text(link, n > 0 ? static_cast<size_t>(n) : 0);
  const auto open = text.find('['), close = text.find(']');
  return open != std::string::npos && close > open ? text.substr(open + 1, close - open - 1) : "0";
}

std::string process_directory_name(pid_t pid) { return pid_namespace() + "-" + std::to_string(pid); }

// This process's directory, made on first use. A forked child does not
// inherit it (the parent keeps using and finally removes it): the child
// makes its own on first use, and only the process that made a directory
// removes it.
struct ProcessDirectory {
  std::mutex mutex;
  pid_t owner = 0;  // the process that made `path`; 0: none yet in this process
  std::string path;

  const std::string& get() {
    std::lock_guard lock(mutex);
    if (owner == ::getpid()) return path;
    const Base base = snapshot_base();
    const std::string user_dir = user_directory(base);
    ensure_private_dir(user_dir, base);
    remove_stale_snapshots();
    std::string mine = user_dir + "/" + process_directory_name(::getpid());
    // One with our pid already there was left by a dead process that had
    // this pid, or by this process before an exec: nothing of ours is in it.
    std::error_code ignored;
    fs::remove_all(mine, ignored);
    ensure_private_dir(mine, base);
    struct statvfs vfs {};
    if (::statvfs(mine.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NOEXEC) != 0) {
      fs::remove_all(mine, ignored);
      fail_directory("snapshot directory " + mine + " is on a filesystem mounted noexec, so no plugin can be "
                     "mapped from it");
    }
    path = std::move(mine);
    owner = ::getpid();
    return path;
  }

  void remove() {
    std::lock_guard lock(mutex);
    if (owner != ::getpid()) return;
    std::error_code ignored;
    fs::remove_all(path, ignored);
    owner = 0;
  }

  ~ProcessDirectory() { remove(); }
};

ProcessDirectory& process_directory() {
  static ProcessDirectory directory;
  return directory;
}

void forget_parent_directory() {
  ProcessDirectory& d = process_directory();
  new (&d.mutex) std::mutex;  // a parent thread may have held it while forking
  d.owner = 0;
}
[[maybe_unused]] const int fork_handler = ::pthread_atfork(nullptr, nullptr, &forget_parent_directory);

// Refuses a file some process still holds open for writing: a linker or a
// copy that has not finished.
void refuse_if_being_written(const struct stat& st, const std::string& when, const ErrorContext& ctx) {
  const auto writers = writers_of(st);
  if (!writers.empty()) {
    ctx.fail(ErrorKind::busy, "is still being written (open for writing by " + describe(writers) + ")" +
                                  (when.empty() ? "" : " " + when) +
                                  "; nothing was loaded: try again once it is closed");
  }
}

}  // namespace

size_t remove_stale_snapshots() {
  const Base base = snapshot_base();
  const std::string user_dir = user_directory(base);
  ensure_private_dir(user_dir, base);
  static const std::regex kProcessDir("([0-9]+)-([0-9]+)");
  const std::string namespace_id = pid_namespace();
  const pid_t me = ::getpid();
  size_t removed = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(user_dir, error)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(error) || entry.is_symlink(error) || !std::regex_match(name, m, kProcessDir) ||
        m[1] != namespace_id) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stoll(m[2]));
    // EPERM means the process exists (another user's): keep its directory.
    const bool dead = pid != me && ::kill(pid, 0) != 0 && errno == ESRCH;
    if (!dead) continue;
    std::error_code failed;
    fs::remove_all(entry.path(), failed);
    if (failed) {
      log::warn("cannot remove stale snapshot directory " + entry.path().string() + ": " + failed.message());
      continue;
    }
    log::debug("removed stale snapshot directory " + entry.path().string());
    ++removed;
  }
  return removed;
}

const std::string& snapshot_directory() { return process_directory().get(); }

void remove_own_snapshot_directory() { process_directory().remove(); }

Snapshot take_snapshot(const std::string& source, TrustPolicy policy, const ErrorContext& ctx) {
  const PluginFile in = open_plugin_file(source, policy, ctx);
  // Not worth a copy: anything without an ELF header (a huge file of
  // something else is refused without being read).
  char magic[4] = {};
  if (::pread(in.fd.get(), magic, sizeof magic, 0) != sizeof magic || std::memcmp(magic, "\177ELF", 4) != 0) {
    ctx.fail(ErrorKind::bad_image, "not an ELF file");
  }
  refuse_if_being_written(in.stat, "", ctx);

  static std::atomic<uint64_t> sequence{0};
  std::string dir;
  try {
    dir = snapshot_directory();
  } catch (const PluginError& e) {
    ctx.fail(ErrorKind::snapshot, e.what());
  }
  const uint64_t seq = ++sequence;
  const std::string temp = dir + "/.incoming-" + std::to_string(seq);
  UniqueFd out(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (out.get() < 0) {
    ctx.fail(ErrorKind::snapshot, "cannot create snapshot " + temp + ": " + errno_text());
  }

  Sha256 hash;
  Snapshot snap;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in.fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::unlink(temp.c_str());
      ctx.fail(ErrorKind::not_found, "cannot read plugin file: " + errno_text());
    }
    if (n == 0) break;
    hash.update(buffer.data(), static_cast<size_t>(n));
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(out.get(), buffer.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const std::string why = errno_text();
        ::unlink(temp.c_str());
        ctx.fail(ErrorKind::snapshot, "cannot write snapshot " + temp + ": " + why);
      }
      done += w;
    }
    snap.size += static_cast<uint64_t>(n);
  }
  // A writer that started after the first look changed the file while it
  // was copied, or still holds it: the copy may be unfinished.
  struct stat after {};
  if (::fstat(in.fd.get(), &after) != 0 || !same_content_stamp(in.stat, after)) {
    ::unlink(temp.c_str());
    ctx.fail(ErrorKind::busy, "changed while it was being copied (still being written?); nothing was loaded: try "
                              "again once it is complete");
  }
  try {
    refuse_if_being_written(after, "after it was copied", ctx);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  snap.sha256 = hash.hex_digest();
  // Content-addressed, plus a sequence number so two loads of one file are
  // two images (dlopen would hand the second load the first one's).
  snap.path = dir + "/" + snap.sha256.substr(0, 16) + "-" + std::to_string(seq) + ".so";
  if (::rename(temp.c_str(), snap.path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    ctx.fail(ErrorKind::snapshot, "cannot place snapshot " + snap.path + ": " + why);
  }
  log::debug("snapshot of " + source + " -> " + snap.path + " (sha256 " + snap.sha256 + ")");
  return snap;
}

void remove_snapshot(const Snapshot& snapshot) {
  if (!snapshot.path.empty()) ::unlink(snapshot.path.c_str());
}

}  // namespace maxdev::plugins
