// The manifest is read without running plugin code, and bad files get
// typed errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "loader_test_util.h"
#include "plugins/manifest.h"
#include "plugins/registry.h"

namespace maxdev::testing {
namespace {

namespace fs = std::filesystem;
using plugins::ErrorKind;
using plugins::PluginRegistry;

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
  {
    std::ifstream in(example_plugin("reference"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, 200);
  }
  expect_plugin_error([&] { PluginRegistry::inspect(empty); }, ErrorKind::bad_image, "not an ELF file");
  expect_plugin_error([&] { PluginRegistry::inspect(text); }, ErrorKind::bad_image, "not an ELF file");
  expect_plugin_error([&] { PluginRegistry::inspect(truncated); }, ErrorKind::bad_image, "truncated.so");
  expect_plugin_error([&] { PluginRegistry::inspect(scratch("missing.so")); }, ErrorKind::not_found,
                      "missing.so");
  // A shared library that is not a plugin: libc has no manifest.
  expect_plugin_error([&] { PluginRegistry::inspect("/lib/x86_64-linux-gnu/libm.so.6"); }, ErrorKind::manifest,
                      "not a max_device plugin");
}

}  // namespace
}  // namespace maxdev::testing
