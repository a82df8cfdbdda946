// libFuzzer target: the bytes of a .maxdev_manifest section through the
// record parser alone, much faster than whole images. Seeds are the manifest
// sections of real plugins. A PluginError is the expected answer; libFuzzer
// reports anything else.
#include <cstdint>

#include "plugins/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    maxdev::plugins::parse_manifest_records(reinterpret_cast<const char*>(data), size,
                                            maxdev::plugins::ErrorContext{"fuzz-input.so", ""});
  } catch (const maxdev::plugins::PluginError&) {
  }
  return 0;
}
