// Private snapshots: what the loader opens instead of the user's file.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
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

  const auto snap = plugins::take_snapshot(fixture("good"), plugins::TrustPolicy::owner_only,
                                           ErrorContext{fixture("good"), ""});
  EXPECT_EQ(fs::path(snap.path).parent_path(), fs::path(dir));
  EXPECT_EQ(fs::path(snap.path).filename().string().substr(0, 16), snap.sha256.substr(0, 16));
  const std::string original = read_file(fixture("good"));
  EXPECT_EQ(original, read_file(snap.path));
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
  expect_plugin_error([] {
                        plugins::take_snapshot(MAXDEV_FIXTURE_DIR, plugins::TrustPolicy::owner_only,
                                               ErrorContext{MAXDEV_FIXTURE_DIR, ""});
                      },
                      plugins::ErrorKind::not_found, "is a directory");
}

TEST(Snapshot, StaleDirectoriesOfDeadProcessesAreRemovedOthersKept) {
  const fs::path own = plugins::snapshot_directory();
  const std::string own_name = own.filename().string();  // "<pid namespace>-<pid>"
  const std::string pid_namespace = own_name.substr(0, own_name.find('-'));
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const fs::path dead_dir = own.parent_path() / (pid_namespace + "-" + std::to_string(dead));
  const fs::path live_dir = own.parent_path() / (pid_namespace + "-" + std::to_string(::getppid()));
  fs::create_directory(dead_dir);
  std::ofstream(dead_dir / "left.so") << "snapshot of a crashed process";
  const bool live_dir_existed = !fs::create_directory(live_dir);

  EXPECT_GE(plugins::remove_stale_snapshots(), 1u);
  EXPECT_FALSE(fs::exists(dead_dir));
  EXPECT_TRUE(fs::is_directory(live_dir));
  EXPECT_TRUE(fs::is_directory(own));
  if (!live_dir_existed) fs::remove(live_dir);
}

TEST(Trust, GroupWritableFileIsRefusedUnlessAllowed) {
  char dir_template[] = "/tmp/maxdev-trust-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const fs::path dir = dir_template;
  const fs::path file = dir / "good.so";
  fs::copy_file(fixture("good"), file);
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_write);
  const ErrorContext ctx{file.string(), ""};
  expect_plugin_error([&] { plugins::take_snapshot(file.string(), plugins::TrustPolicy::owner_only, ctx); },
                      plugins::ErrorKind::untrusted, "writable by group or others (mode 0620)");
  const auto snap = plugins::take_snapshot(file.string(), plugins::TrustPolicy::allow_untrusted, ctx);
  EXPECT_EQ(snap.sha256, sha256_of(read_file(file.string())));
  plugins::remove_snapshot(snap);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace maxdev::testing
