// The byte ranges of a plugin image that the manifest reader interprets: the
// ELF header, the section header table, and the contents of the manifest,
// dynamic symbol and string table sections. The fuzzer aims its mutations
// there, and test_manifest.cpp corrupts each of them; bytes elsewhere (code,
// data) are never read.
#pragma once

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <max_device/plugin.h>

namespace maxdev::fuzz {

struct Region {
  size_t offset;
  size_t size;
};

// Bounds-checked throughout: `image` may already be corrupt. Returns fewer
// regions (or none) the less of the layout survives.
inline std::vector<Region> regions_read_by_manifest_reader(const uint8_t* image, size_t size) {
  std::vector<Region> regions;
  Elf64_Ehdr header;
  if (size < sizeof(header)) return regions;
  std::memcpy(&header, image, sizeof(header));
  regions.push_back({0, sizeof(header)});
  if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shoff > size ||
      header.e_shnum > (size - header.e_shoff) / sizeof(Elf64_Shdr) || header.e_shnum == 0) {
    return regions;
  }
  regions.push_back({static_cast<size_t>(header.e_shoff), header.e_shnum * sizeof(Elf64_Shdr)});
  const auto section = [&](size_t index) {
    Elf64_Shdr s;
    std::memcpy(&s, image + header.e_shoff + index * sizeof(s), sizeof(s));
    return s;
  };
  const auto in_file = [&](const Elf64_Shdr& s) {
    return s.sh_type != SHT_NOBITS && s.sh_size != 0 && s.sh_offset <= size && s.sh_size <= size - s.sh_offset;
  };
  const Elf64_Shdr names = header.e_shstrndx < header.e_shnum ? section(header.e_shstrndx) : Elf64_Shdr{};
  const auto is_manifest = [&](const Elf64_Shdr& s) {
    constexpr size_t kLength = sizeof(MAXDEV_MANIFEST_SECTION);  // with the NUL
    return in_file(names) && s.sh_name < names.sh_size && names.sh_size - s.sh_name >= kLength &&
           std::memcmp(image + names.sh_offset + s.sh_name, MAXDEV_MANIFEST_SECTION, kLength) == 0;
  };
  for (size_t i = 0; i < header.e_shnum; ++i) {
    const Elf64_Shdr s = section(i);
    if (in_file(s) && (s.sh_type == SHT_DYNSYM || s.sh_type == SHT_STRTAB || is_manifest(s))) {
      regions.push_back({static_cast<size_t>(s.sh_offset), static_cast<size_t>(s.sh_size)});
    }
  }
  return regions;
}

}  // namespace maxdev::fuzz
