// The manifest is read without running plugin code, and bad files get
// typed errors.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../fuzz/elf_regions.h"
#include "loader_test_util.h"
#include "plugins/manifest.h"
#include "plugins/registry.h"

namespace maxdev::testing {
namespace {

namespace fs = std::filesystem;
using plugins::ErrorKind;
using plugins::PluginRegistry;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

plugins::Manifest read_image(const std::string& image) {
  return plugins::read_manifest_image(image.data(), image.size(), plugins::ErrorContext{"image.so", ""});
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("maxdev-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

TEST(Manifest, ReferencePluginDeclaresItsKernels) {
  const auto m = PluginRegistry::inspect(example_plugin("reference"));
  EXPECT_EQ(m.name, "reference");
  EXPECT_EQ(m.version, "1.0.0");
  EXPECT_EQ(m.abi_major, static_cast<uint32_t>(MAXDEV_ABI_MAJOR));
  EXPECT_GE(m.kernels.size(), 20u);
  EXPECT_EQ(m.exported_symbols, std::vector<std::string>{"maxdev_plugin_entry"});
}

TEST(Manifest, CustomOpSchemaIsInTheManifest) {
  const auto m = PluginRegistry::inspect(example_plugin("sdk_example"));
  bool found = false;
  for (const auto& k : m.kernels) {
    if (k.op == "myplug::rms_norm") {
      found = true;
      EXPECT_EQ(k.schema, "myplug::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    }
  }
  EXPECT_TRUE(found);
}

TEST(Manifest, InspectRunsNoPluginCodeButLoadDoes) {
  const fs::path trace = scratch("trace.txt");
  fs::remove(trace);
  ::setenv("MAXDEV_FIXTURE_TRACE", trace.c_str(), 1);
  const auto m = PluginRegistry::inspect(fixture("traced"));
  EXPECT_EQ(m.name, "traced");
  EXPECT_FALSE(fs::exists(trace)) << "inspect ran the plugin's constructor";
  PluginRegistry::instance().load(fixture("traced"), std::nullopt);
  EXPECT_TRUE(fs::exists(trace)) << "loading should have run the constructor (the fixture works)";
  PluginRegistry::instance().unload("traced");
  ::unsetenv("MAXDEV_FIXTURE_TRACE");
}

TEST(Manifest, BadFilesGetTypedErrors) {
  const fs::path empty = scratch("empty.so");
  std::ofstream(empty).close();
  const fs::path text = scratch("text.so");
  std::ofstream(text) << "this is not an ELF file\n";
  const fs::path truncated = scratch("truncated.so");
  std::ofstream(truncated, std::ios::binary) << file_bytes(example_plugin("reference")).substr(0, 200);
  expect_plugin_error([&] { PluginRegistry::inspect(empty); }, ErrorKind::bad_image, "not an ELF file");
  expect_plugin_error([&] { PluginRegistry::inspect(text); }, ErrorKind::bad_image, "not an ELF file");
  expect_plugin_error([&] { PluginRegistry::inspect(truncated); }, ErrorKind::bad_image, "truncated.so");
  expect_plugin_error([&] { PluginRegistry::inspect(scratch("missing.so")); }, ErrorKind::not_found,
                      "missing.so");
  // A shared library that is not a plugin: libc has no manifest.
  expect_plugin_error([&] { PluginRegistry::inspect("/lib/x86_64-linux-gnu/libm.so.6"); }, ErrorKind::manifest,
                      "not a max_device plugin");
}

TEST(Manifest, ImageInMemoryReadsLikeTheFile) {
  const std::string path = example_plugin("sdk_example");
  const auto from_file = PluginRegistry::inspect(path);
  const auto from_memory = read_image(file_bytes(path));
  EXPECT_EQ(from_memory.name, from_file.name);
  EXPECT_EQ(from_memory.version, from_file.version);
  EXPECT_EQ(from_memory.exported_symbols, from_file.exported_symbols);
  ASSERT_EQ(from_memory.kernels.size(), from_file.kernels.size());
  for (size_t i = 0; i < from_file.kernels.size(); ++i) {
    EXPECT_EQ(from_memory.kernels[i].op, from_file.kernels[i].op);
    EXPECT_EQ(from_memory.kernels[i].schema, from_file.kernels[i].schema);
    EXPECT_EQ(from_memory.kernels[i].dtypes, from_file.kernels[i].dtypes);
  }
}

// A section whose offset plus size wraps past 2^64 used to pass the bounds
// check as a small sum, and the plugin was accepted.
TEST(Manifest, SectionOffsetThatWrapsAroundIsTruncation) {
  std::string image = file_bytes(fixture("good"));
  Elf64_Ehdr header;
  std::memcpy(&header, image.data(), sizeof(header));
  Elf64_Shdr section;
  char* first = image.data() + header.e_shoff + sizeof(section);  // section 0 is the null section
  std::memcpy(&section, first, sizeof(section));
  ASSERT_NE(section.sh_type, static_cast<uint32_t>(SHT_NOBITS));
  section.sh_offset = UINT64_MAX - 7;
  section.sh_size = 16;
  std::memcpy(first, &section, sizeof(section));
  expect_plugin_error([&] { read_image(image); }, ErrorKind::bad_image, "a section ends beyond the end");
}

// The fuzzer's property, deterministic and under every sanitizer build: each
// byte the reader interprets in a real plugin, inverted in turn, is read or
// refused with a PluginError; cutting the file short anywhere is refused.
TEST(Manifest, CorruptingAnyByteItReadsGetsATypedAnswer) {
  const std::string original = file_bytes(fixture("good"));
  const auto regions =
      fuzz::regions_read_by_manifest_reader(reinterpret_cast<const uint8_t*>(original.data()), original.size());
  ASSERT_GE(regions.size(), 5u) << "ELF header, section table, .dynsym, .dynstr and the manifest at least";
  size_t refused = 0;
  size_t variants = 0;
  for (const auto& region : regions) {
    for (size_t at = region.offset; at < region.offset + region.size; ++at) {
      std::string image = original;
      image[at] = static_cast<char>(~image[at]);
      ++variants;
      try {
        read_image(image);
      } catch (const plugins::PluginError&) {
        ++refused;
      }
    }
    const size_t cut = region.offset + region.size / 2;
    EXPECT_THROW(read_image(original.substr(0, cut)), plugins::PluginError) << "cut at byte " << cut;
  }
  // Inverting the ELF magic or a record's magic, for one, must be refused.
  EXPECT_GT(refused, 0u) << variants << " variants";
}

}  // namespace
}  // namespace maxdev::testing
