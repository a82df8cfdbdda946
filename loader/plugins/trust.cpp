#include "plugins/trust.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace maxdev::plugins {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Why another user could change what `st` describes, or "" if nobody can.
std::string why_untrusted(const struct stat& st, bool is_directory) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return "is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(me) +
           ") or root";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) == 0) return "";
  // In a sticky directory (such as /tmp, mode 1777) others may create
  // files but not rename or delete ours, so our file there stays ours; a
  // file someone else created there fails the owner check above.
  if (is_directory && (st.st_mode & S_ISVTX) != 0) return "";
  return std::string("is writable by group or others (mode ") + octal_mode(st.st_mode) + ")";
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

PluginFile open_plugin_file(const std::string& path, TrustPolicy policy, const ErrorContext& ctx) {
  // Symlinks are resolved once; the directory is then opened and the file
  // opened inside that very directory without following links, so a link
  // swapped in afterwards makes the open fail instead of redirecting it.
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  if (!real) ctx.fail(ErrorKind::not_found, "cannot open plugin file: " + errno_text());
  const std::string resolved = real.get();
  const size_t slash = resolved.rfind('/');
  const std::string directory = slash == 0 ? "/" : resolved.substr(0, slash);
  const std::string base = resolved.substr(slash + 1);

  UniqueFd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) ctx.fail(ErrorKind::not_found, "cannot open directory " + directory + ": " + errno_text());
  // O_NONBLOCK: opening a FIFO must not hang; regular files ignore it.
  PluginFile file{UniqueFd(::openat(dir.get(), base.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC))};
  if (file.fd.get() < 0) ctx.fail(ErrorKind::not_found, "cannot open plugin file: " + errno_text());
  if (::fstat(file.fd.get(), &file.stat) != 0) ctx.fail(ErrorKind::not_found, "cannot stat: " + errno_text());
  if (S_ISDIR(file.stat.st_mode)) ctx.fail(ErrorKind::not_found, "is a directory, not a plugin file");
  if (!S_ISREG(file.stat.st_mode)) ctx.fail(ErrorKind::not_found, "is not a regular file");
  if (policy == TrustPolicy::allow_untrusted) return file;

  // Loading runs a private copy, which would bypass a noexec mount of the
  // original: that mount says code from there must not run.
  struct statvfs vfs {};
  if (::fstatvfs(file.fd.get(), &vfs) == 0 && (vfs.f_flag & ST_NOEXEC) != 0) {
    ctx.fail(ErrorKind::untrusted, "refused: it lives on a filesystem mounted noexec, which forbids running code "
                                   "from it (loading a private copy would bypass that); move it, or pass "
                                   "allow_untrusted=True to load it anyway");
  }

  struct stat dir_stat {};
  if (::fstat(dir.get(), &dir_stat) != 0) ctx.fail(ErrorKind::not_found, "cannot stat " + directory);
  std::string why = why_untrusted(file.stat, false);
  if (why.empty()) {
    why = why_untrusted(dir_stat, true);
    if (!why.empty()) why = "its directory " + directory + " " + why;
  } else {
    why = "the file " + (resolved == path ? "" : resolved + " ") + why;
  }
  if (!why.empty()) {
    ctx.fail(ErrorKind::untrusted, "refused: " + why +
                                       ", so another user could change the code this process would run; fix "
                                       "the ownership/permissions, or pass allow_untrusted=True to load it anyway");
  }
  return file;
}

}  // namespace maxdev::plugins
