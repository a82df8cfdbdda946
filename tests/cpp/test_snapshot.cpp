// Private snapshots: what the loader opens instead of the user's file.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loader_test_util.h"
#include "plugins/registry.h"
#include "plugins/sha256.h"
#include "plugins/snapshot.h"

namespace maxdev::testing {
namespace {

namespace fs = std::filesystem;
using plugins::ErrorContext;

std::string sha256_of(const std::string& text) {
  plugins::Sha256 h;
  h.update(text.data(), text.size());
  return h.hex_digest();
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_of(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(Snapshot, CopiesIntoAPrivateDirectoryUnderItsHash) {
  const std::string dir = plugins::snapshot_directory();
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  const auto snap = plugins::take_snapshot(fixture("good"), ErrorContext{fixture("good"), ""});
  EXPECT_EQ(fs::path(snap.path).parent_path(), fs::path(dir));
  EXPECT_EQ(fs::path(snap.path).filename().string().substr(0, 16), snap.sha256.substr(0, 16));
  std::ifstream a(fixture("good"), std::ios::binary), b(snap.path, std::ios::binary);
  const std::string original((std::istreambuf_iterator<char>(a)), {});
  const std::string copy((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(original, copy);
  EXPECT_EQ(snap.sha256, sha256_of(original));
  plugins::remove_snapshot(snap);
  EXPECT_FALSE(fs::exists(snap.path));
}

TEST(Snapshot, LoadedPluginRunsFromItsSnapshotWhichUnloadRemoves) {
  auto& registry = plugins::PluginRegistry::instance();
  const auto info = registry.load(fixture("good"), std::nullopt);
  EXPECT_NE(info.snapshot, info.path);
  EXPECT_TRUE(fs::exists(info.snapshot));
  registry.unload("good");
  EXPECT_FALSE(fs::exists(info.snapshot));
}

TEST(Snapshot, DirectoryIsRefused) {
  expect_plugin_error([] { plugins::take_snapshot(MAXDEV_FIXTURE_DIR, ErrorContext{MAXDEV_FIXTURE_DIR, ""}); },
                      plugins::ErrorKind::not_found, "is a directory");
}

}  // namespace
}  // namespace maxdev::testing
