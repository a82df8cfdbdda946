#include "plugins/manifest.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/stat.h>

#include <vector>

#include <max_device/plugin.h>

namespace maxdev::plugins {
namespace {

constexpr size_t kMaxKernels = 100000;

#if defined(__x86_64__)
constexpr int kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kHostMachine = EM_AARCH64;
#else
#error "unsupported host architecture"
#endif

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += len;
  }
  return true;
}

// A fixed-size, NUL-terminated text field of a record.
std::string text_field(const char* field, size_t size, const std::string& what, const ErrorContext& ctx) {
  const size_t len = strnlen(field, size);
  if (len == size) ctx.fail(ErrorKind::manifest, "manifest " + what + " is not NUL-terminated");
  std::string value(field, len);
  if (!valid_utf8(value)) ctx.fail(ErrorKind::manifest, "manifest " + what + " is not UTF-8");
  return value;
}

struct ElfCloser {
  void operator()(Elf* e) const { elf_end(e); }
};

// What the loader needs from the file, read with libelf alone. (Boost.DLL
// 1.74's library_info::symbols() reads .symtab, absent from stripped
// libraries, with whichever string table comes last: it names the wrong
// symbols. The dynamic symbol table is what dlopen sees.)
struct ElfFacts {
  std::vector<char> manifest;
  std::vector<std::string> exported;  // defined, default-visibility dynamic symbols
};

// The whole file (libelf's ELF_C_READ reads all of it as well), once its
// first bytes show an ELF header: a huge file of something else is refused
// without being read.
std::vector<char> read_file(const std::string& path, const ErrorContext& ctx) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) ctx.fail(ErrorKind::not_found, std::string("cannot open: ") + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) ctx.fail(ErrorKind::not_found, std::string("cannot stat: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) ctx.fail(ErrorKind::not_found, "is a directory, not a plugin file");
  if (!S_ISREG(st.st_mode)) ctx.fail(ErrorKind::not_found, "is not a regular file");
  char magic[SELFMAG] = {};
  if (::pread(fd, magic, SELFMAG, 0) != SELFMAG || std::memcmp(magic, ELFMAG, SELFMAG) != 0) {
    ctx.fail(ErrorKind::bad_image, "not an ELF file");
  }
  std::vector<char> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ctx.fail(ErrorKind::not_found, std::string("cannot read: ") + std::strerror(errno));
    if (n == 0) break;  // shrunk since fstat: parse what is there
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// `image` is the library's bytes; libelf may convert data in place, so it is
// a buffer this reader owns.
ElfFacts read_elf(std::vector<char>& image, const ErrorContext& ctx) {
  if (elf_version(EV_CURRENT) == EV_NONE) ctx.fail(ErrorKind::bad_image, "libelf is unusable");
  const uint64_t file_size = image.size();
  std::unique_ptr<Elf, ElfCloser> elf(image.empty() ? nullptr : elf_memory(image.data(), image.size()));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) ctx.fail(ErrorKind::bad_image, "not an ELF file");
  GElf_Ehdr header;
  if (gelf_getehdr(elf.get(), &header) == nullptr) {
    ctx.fail(ErrorKind::bad_image, std::string("corrupt or truncated ELF header: ") + elf_errmsg(-1));
  }
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_machine != kHostMachine) {
    ctx.fail(ErrorKind::bad_image, "ELF file for another architecture (machine " +
                                       std::to_string(header.e_machine) + ")");
  }
  if (header.e_type != ET_DYN) {
    ctx.fail(ErrorKind::bad_image, "not a shared library (ELF type " + std::to_string(header.e_type) + ")");
  }
  if (header.e_shoff == 0 || header.e_shoff > file_size ||
      uint64_t(header.e_shnum) * header.e_shentsize > file_size - header.e_shoff) {
    ctx.fail(ErrorKind::bad_image, "truncated ELF file (" + std::to_string(file_size) +
                                       " bytes; the section table lies beyond the end)");
  }

  size_t names_index = 0;
  if (elf_getshdrstrndx(elf.get(), &names_index) != 0) {
    ctx.fail(ErrorKind::bad_image, std::string("corrupt section table: ") + elf_errmsg(-1));
  }
  ElfFacts facts;
  bool have_manifest = false;
  for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn != nullptr; scn = elf_nextscn(elf.get(), scn)) {
    GElf_Shdr section;
    if (gelf_getshdr(scn, &section) == nullptr) {
      ctx.fail(ErrorKind::bad_image, std::string("corrupt section header: ") + elf_errmsg(-1));
    }
    // Compared without adding: a huge offset would wrap the sum.
    if (section.sh_type != SHT_NOBITS &&
        (section.sh_offset > file_size || section.sh_size > file_size - section.sh_offset)) {
      ctx.fail(ErrorKind::bad_image, "truncated ELF file (a section ends beyond the end of the file)");
    }
    if (section.sh_type == SHT_DYNSYM) {
      Elf_Data* data = elf_getdata(scn, nullptr);
      const size_t count = section.sh_entsize == 0 || data == nullptr ? 0 : section.sh_size / section.sh_entsize;
      for (size_t i = 0; i < count; ++i) {
        GElf_Sym sym;
        if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) continue;
        if (sym.st_shndx == SHN_UNDEF || GELF_ST_BIND(sym.st_info) == STB_LOCAL ||
            GELF_ST_VISIBILITY(sym.st_other) != STV_DEFAULT) {
          continue;
        }
        const char* name = elf_strptr(elf.get(), section.sh_link, sym.st_name);
        if (name != nullptr && *name != '\0') facts.exported.emplace_back(name);
      }
      continue;
    }
    const char* name = elf_strptr(elf.get(), names_index, section.sh_name);
    if (name == nullptr || std::strcmp(name, MAXDEV_MANIFEST_SECTION) != 0) continue;
    if (section.sh_type == SHT_NOBITS) ctx.fail(ErrorKind::manifest, "manifest section has no contents");
    Elf_Data* data = elf_rawdata(scn, nullptr);
    if (data == nullptr || (data->d_buf == nullptr && data->d_size != 0)) {
      ctx.fail(ErrorKind::manifest, std::string("cannot read manifest section: ") + elf_errmsg(-1));
    }
    const char* bytes = static_cast<const char*>(data->d_buf);
    facts.manifest.assign(bytes, bytes + data->d_size);
    have_manifest = true;
  }
  if (!have_manifest) {
    ctx.fail(ErrorKind::manifest,
             "no " MAXDEV_MANIFEST_SECTION " section: not a max_device plugin (build it with "
             "MAXDEV_DEFINE_PLUGIN)");
  }
  return facts;
}

// Reads `image` (owned: see read_elf), checks the entry point, then parses
// the records.
Manifest read_owned_image(std::vector<char>& image, const ErrorContext& ctx) {
  ElfFacts facts = read_elf(image, ctx);
  const auto& syms = facts.exported;
  if (std::find(syms.begin(), syms.end(), MAXDEV_ENTRY_SYMBOL) == syms.end()) {
    ctx.fail(ErrorKind::bad_image, "does not export the entry point " MAXDEV_ENTRY_SYMBOL);
  }
  Manifest manifest = parse_manifest_records(facts.manifest.data(), facts.manifest.size(), ctx);
  manifest.exported_symbols = std::move(facts.exported);
  return manifest;
}

}  // namespace

Manifest read_manifest(const std::string& path, const ErrorContext& ctx) {
  std::vector<char> image = read_file(path, ctx);
  return read_owned_image(image, ctx);
}

Manifest read_manifest_image(const char* image, size_t size, const ErrorContext& ctx) {
  std::vector<char> copy(image, image + size);
  return read_owned_image(copy, ctx);
}

Manifest parse_manifest_records(const char* bytes, size_t size, const ErrorContext& ctx) {
  Manifest manifest;
  bool have_plugin = false;
  size_t offset = 0;
  while (offset < size) {
    // The linker may pad between records; padding is zeros.
    uint32_t magic = 0;
    if (size - offset < sizeof(magic)) break;
    std::memcpy(&magic, bytes + offset, sizeof(magic));
    if (magic == 0) {
      offset += 8;
      continue;
    }
    if (magic != MAXDEV_MANIFEST_MAGIC) {
      ctx.fail(ErrorKind::manifest, "corrupt manifest record at byte " + std::to_string(offset));
    }
    maxdev_manifest_record record{};
    if (size - offset < offsetof(maxdev_manifest_record, kind)) {
      ctx.fail(ErrorKind::manifest, "truncated manifest record at byte " + std::to_string(offset));
    }
    uint32_t record_size = 0;
    std::memcpy(&record_size, bytes + offset + sizeof(magic), sizeof(record_size));
    if (record_size < sizeof(record) || record_size > size - offset) {
      ctx.fail(ErrorKind::manifest, "manifest record at byte " + std::to_string(offset) +
                                        " has size " + std::to_string(record_size) +
                                        ", expected at least " + std::to_string(sizeof(record)));
    }
    std::memcpy(&record, bytes + offset, sizeof(record));
    offset += record_size;

    if (record.kind == MAXDEV_MANIFEST_PLUGIN) {
      if (have_plugin) ctx.fail(ErrorKind::manifest, "manifest has two plugin records");
      have_plugin = true;
      // The major is read, and refused, before any other field.
      manifest.abi_major = record.abi_major;
      manifest.abi_minor = record.abi_minor;
      if (manifest.abi_major != MAXDEV_ABI_MAJOR) {
        ctx.fail(ErrorKind::abi_mismatch,
                 "built for plugin ABI " + std::to_string(record.abi_major) + "." +
                     std::to_string(record.abi_minor) + "; this max_device accepts ABI " +
                     std::to_string(MAXDEV_ABI_MAJOR) + ".0 to " + std::to_string(MAXDEV_ABI_MAJOR) +
                     "." + std::to_string(MAXDEV_ABI_MINOR));
      }
      manifest.name = text_field(record.name, sizeof(record.name), "plugin name", ctx);
      manifest.version = text_field(record.text, sizeof(record.text), "plugin version", ctx);
    } else if (record.kind == MAXDEV_MANIFEST_KERNEL) {
      if (!have_plugin) ctx.fail(ErrorKind::manifest, "manifest lists kernels before the plugin record");
      if (manifest.kernels.size() >= kMaxKernels) {
        ctx.fail(ErrorKind::manifest, "manifest lists more than " + std::to_string(kMaxKernels) + " kernels");
      }
      KernelManifest kernel;
      kernel.op = text_field(record.name, sizeof(record.name), "op name", ctx);
      kernel.schema = text_field(record.text, sizeof(record.text), "schema of " + kernel.op, ctx);
      kernel.dtypes = record.dtypes;
      kernel.flags = record.flags;
      manifest.kernels.push_back(std::move(kernel));
    } else {
      ctx.fail(ErrorKind::manifest, "unknown manifest record kind " + std::to_string(record.kind));
    }
  }
  if (!have_plugin) ctx.fail(ErrorKind::manifest, "manifest has no plugin record");
  return manifest;
}

}  // namespace maxdev::plugins
