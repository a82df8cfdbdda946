// Who is still writing a file: the processes that hold it open for writing.
//
// A linker publishes its output before it finishes (ld.bfd writes the
// build-id last; gold and lld may size the file first and fill it out of
// order), so a file that parses as a complete plugin may still change. The
// kernel knows who holds it open: /proc/<pid>/fd links to it, and
// /proc/<pid>/fdinfo/<fd> says whether that descriptor may write. Only
// processes this user may inspect are seen (all of them for root).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace maxdev::plugins {

struct FileWriter {
  pid_t pid = 0;
  std::string command;  // /proc/<pid>/comm, e.g. "ld"
};

// Processes holding the file `st` describes (device + inode) open for
// writing, this one included.
std::vector<FileWriter> writers_of(const struct stat& st);

// "pid 1234 (ld), pid 99 (python3)"
std::string describe(const std::vector<FileWriter>& writers);

// Whether two stats of one file show the same content: same file, size,
// and modification and status-change times (nanoseconds).
bool same_content_stamp(const struct stat& a, const struct stat& b);

}  // namespace maxdev::plugins
