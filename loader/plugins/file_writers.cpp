#include "plugins/file_writers.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

namespace maxdev::plugins {
namespace {

bool is_number(const char* s) {
  if (*s == '\0') return false;
  for (; *s != '\0'; ++s) {
    if (*s < '0' || *s > '9') return false;
  }
  return true;
}

// The access mode of descriptor `fd` of process `pid` (O_RDONLY, O_WRONLY
// or O_RDWR), from the "flags:" line of its fdinfo; -1 if unreadable.
int access_mode(const std::string& pid, const char* fd) {
  std::ifstream info("/proc/" + pid + "/fdinfo/" + fd);
  std::string key;
  while (info >> key) {
    if (key == "flags:") {
      std::string octal;
      info >> octal;
      return static_cast<int>(std::strtol(octal.c_str(), nullptr, 8)) & O_ACCMODE;
    }
  }
  return -1;
}

std::string command_of(const std::string& pid) {
  std::ifstream comm("/proc/" + pid + "/comm");
  std::string name;
  std::getline(comm, name);
  return name.empty() ? "?" : name;
}

using Dir = std::unique_ptr<DIR, int (*)(DIR*)>;

}  // namespace

std::vector<FileWriter> writers_of(const struct stat& target) {
  std::vector<FileWriter> writers;
  Dir proc(::opendir("/proc"), &::closedir);
  if (!proc) return writers;
  while (const dirent* p = ::readdir(proc.get())) {
    if (!is_number(p->d_name)) continue;
    const std::string pid = p->d_name;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    Dir fds(::opendir(fd_dir.c_str()), &::closedir);
    if (!fds) continue;  // gone, or another user's
    while (const dirent* f = ::readdir(fds.get())) {
      if (!is_number(f->d_name)) continue;
      struct stat st {};
      // stat follows the fd link to the open file itself, even if it was
      // renamed or deleted since.
      if (::fstatat(::dirfd(fds.get()), f->d_name, &st, 0) != 0) continue;
      if (st.st_dev != target.st_dev || st.st_ino != target.st_ino) continue;
      const int mode = access_mode(pid, f->d_name);
      if (mode == O_WRONLY || mode == O_RDWR) {
        writers.push_back({static_cast<pid_t>(std::atol(pid.c_str())), command_of(pid)});
        break;
      }
    }
  }
  return writers;
}

std::string describe(const std::vector<FileWriter>& writers) {
  std::string out;
  for (const auto& w : writers) {
    out += (out.empty() ? "" : ", ") + std::string("pid ") + std::to_string(w.pid) + " (" + w.command + ")";
  }
  return out;
}

bool same_content_stamp(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

}  // namespace maxdev::plugins
