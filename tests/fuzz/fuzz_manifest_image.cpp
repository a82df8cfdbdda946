// libFuzzer target: a whole plugin file image through the reader that
// PluginRegistry::inspect and load use. A PluginError is the expected answer
// to a corrupt image; libFuzzer reports anything else (crash, sanitizer
// error, leak, hang, any other exception).
#include <cstdint>
#include <cstdlib>
#include <random>

#include "elf_regions.h"
#include "plugins/manifest.h"

using maxdev::plugins::ErrorContext;
using maxdev::plugins::PluginError;

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto manifest = maxdev::plugins::read_manifest_image(reinterpret_cast<const char*>(data), size,
                                                               ErrorContext{"fuzz-input.so", ""});
    // Accepted: the reader promised an entry point.
    bool has_entry = false;
    for (const auto& symbol : manifest.exported_symbols) has_entry |= symbol == MAXDEV_ENTRY_SYMBOL;
    if (!has_entry) std::abort();
  } catch (const PluginError&) {
  }
  return 0;
}

// Seeds are real plugins, mostly code the reader never looks at: three
// mutations in four stay inside one region it does read (size unchanged, so
// the layout around it holds); the fourth is libFuzzer's own, anywhere, and
// may grow or truncate the file.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand random(seed);
  const auto regions = maxdev::fuzz::regions_read_by_manifest_reader(data, size);
  if (regions.empty() || random() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  const auto region = regions[random() % regions.size()];
  LLVMFuzzerMutate(data + region.offset, region.size, region.size);
  return size;
}
