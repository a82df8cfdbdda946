// The manifest a plugin embeds (section .maxdev_manifest), read without
// loading the library: no plugin code runs, not even its constructors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plugins/errors.h"

namespace maxdev::plugins {

struct KernelManifest {
  std::string op;      // "aten::add.out"
  std::string schema;  // full schema for an op the plugin defines; else ""
  uint64_t dtypes = 0;
  uint64_t flags = 0;
};

struct Manifest {
  std::string name;
  std::string version;
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  std::vector<KernelManifest> kernels;
  std::vector<std::string> exported_symbols;  // defined dynamic symbols
};

// Reads and checks the manifest of the shared library at `path`. Throws
// PluginError: bad_image (not an ELF shared library for this machine, no
// entry point), abi_mismatch (another ABI major), manifest (missing or
// malformed).
Manifest read_manifest(const std::string& path, const ErrorContext& ctx);

// The same checks on a library image already in memory (`size` bytes at
// `image`, which is not modified); the fuzzer reads this way, without files.
Manifest read_manifest_image(const char* image, size_t size, const ErrorContext& ctx);

// Parses the records of a .maxdev_manifest section alone: name, version,
// ABI and kernels, no exported symbols. Throws PluginError as above.
Manifest parse_manifest_records(const char* bytes, size_t size, const ErrorContext& ctx);

}  // namespace maxdev::plugins
