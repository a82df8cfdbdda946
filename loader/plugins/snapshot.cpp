#include "plugins/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/log.h"
#include "plugins/sha256.h"

namespace maxdev::plugins {
namespace {

namespace fs = std::filesystem;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

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

struct SnapshotDirectory {
  std::string path;
  SnapshotDirectory() {
    const char* base = std::getenv("MAX_DEVICE_SNAPSHOT_DIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    const std::string user_dir = std::string(base) + "/max_device-" + std::to_string(::geteuid());
    ensure_private_dir(user_dir);
    path = user_dir + "/" + std::to_string(::getpid());
    ensure_private_dir(path);
  }
  ~SnapshotDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

const std::string& snapshot_directory() {
  static SnapshotDirectory dir;
  return dir.path;
}

Snapshot take_snapshot(const std::string& source, const ErrorContext& ctx) {
  Fd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) {
    ctx.fail(ErrorKind::not_found, "cannot open plugin file: " + errno_text());
  }
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) ctx.fail(ErrorKind::not_found, "cannot stat: " + errno_text());
  if (S_ISDIR(st.st_mode)) ctx.fail(ErrorKind::not_found, "is a directory, not a plugin file");
  if (!S_ISREG(st.st_mode)) ctx.fail(ErrorKind::not_found, "is not a regular file");

  static std::atomic<uint64_t> sequence{0};
  const std::string& dir = snapshot_directory();
  const uint64_t seq = ++sequence;
  const std::string temp = dir + "/.incoming-" + std::to_string(seq);
  Fd out(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (out.get() < 0) {
    ctx.fail(ErrorKind::not_found, "cannot create snapshot " + temp + ": " + errno_text());
  }

  Sha256 hash;
  Snapshot snap;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
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
