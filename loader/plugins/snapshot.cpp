#include "plugins/snapshot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <vector>

#include "common/log.h"
#include "plugins/sha256.h"

namespace maxdev::plugins {
namespace {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

// Creates `dir` with mode 0700, or accepts it if it exists, is a directory
// (not a link), belongs to us and nobody else can enter it.
void ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::runtime_error("cannot create snapshot directory " + dir + ": " + errno_text());
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    throw std::runtime_error("snapshot directory " + dir +
                             " is not a private directory of this user (mode 0700); "
                             "remove it or set MAX_DEVICE_SNAPSHOT_DIR");
  }
}

// The directory holding this user's per-process snapshot directories.
std::string user_directory() {
  const char* base = std::getenv("MAX_DEVICE_SNAPSHOT_DIR");
  if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
  if (base == nullptr || *base == '\0') base = "/tmp";
  return std::string(base) + "/max_device-" + std::to_string(::geteuid());
}

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

struct SnapshotDirectory {
  std::string path;
  SnapshotDirectory() {
    const std::string user_dir = user_directory();
    ensure_private_dir(user_dir);
    remove_stale_snapshots();
    path = user_dir + "/" + process_directory_name(::getpid());
    // One with our pid already there was left by a dead process that had
    // this pid, or by this process before an exec: nothing of ours is in it.
    std::error_code ignored;
    fs::remove_all(path, ignored);
    ensure_private_dir(path);
  }
  ~SnapshotDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

size_t remove_stale_snapshots() {
  const std::string user_dir = user_directory();
  ensure_private_dir(user_dir);
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

const std::string& snapshot_directory() {
  static SnapshotDirectory dir;
  return dir.path;
}

Snapshot take_snapshot(const std::string& source, TrustPolicy policy, const ErrorContext& ctx) {
  const PluginFile in = open_plugin_file(source, policy, ctx);

  static std::atomic<uint64_t> sequence{0};
  const std::string& dir = snapshot_directory();
  const uint64_t seq = ++sequence;
  const std::string temp = dir + "/.incoming-" + std::to_string(seq);
  UniqueFd out(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (out.get() < 0) {
    ctx.fail(ErrorKind::not_found, "cannot create snapshot " + temp + ": " + errno_text());
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
        ::unlink(temp.c_str());
        ctx.fail(ErrorKind::not_found, "cannot write snapshot: " + errno_text());
      }
      done += w;
    }
    snap.size += static_cast<uint64_t>(n);
  }
  snap.sha256 = hash.hex_digest();
  // Content-addressed, plus a sequence number so two loads of one file are
  // two images (dlopen would hand the second load the first one's).
  snap.path = dir + "/" + snap.sha256.substr(0, 16) + "-" + std::to_string(seq) + ".so";
  if (::rename(temp.c_str(), snap.path.c_str()) != 0) {
    ::unlink(temp.c_str());
    ctx.fail(ErrorKind::not_found, "cannot place snapshot: " + errno_text());
  }
  log::debug("snapshot of " + source + " -> " + snap.path + " (sha256 " + snap.sha256 + ")");
  return snap;
}

void remove_snapshot(const Snapshot& snapshot) {
  if (!snapshot.path.empty()) ::unlink(snapshot.path.c_str());
}

}  // namespace maxdev::plugins
