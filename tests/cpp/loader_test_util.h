// Helpers shared by the loader's GoogleTest files.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include <max_device/plugin.h>

#include "plugins/errors.h"

namespace maxdev::testing {

inline std::string fixture(const std::string& name) {
  return std::string(MAXDEV_FIXTURE_DIR) + "/" + name + ".so";
}
inline std::string example_plugin(const std::string& name) {
  return std::string(MAXDEV_PLUGIN_DIR) + "/lib" + name + ".so";
}

inline at::Tensor device_tensor(c10::IntArrayRef sizes) {
  return at::empty(sizes, at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, 0)));
}

// Runs `fn`, expects a PluginError of `kind` whose message contains `part`.
template <typename Fn>
void expect_plugin_error(Fn&& fn, plugins::ErrorKind kind, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "expected a PluginError of kind " << plugins::error_kind_name(kind);
  } catch (const plugins::PluginError& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

// `call` raises c10::Error and its message has every one of `parts`.
template <typename Fn>
void expect_error_naming(Fn&& call, std::initializer_list<const char*> parts) {
  try {
    call();
    ADD_FAILURE() << "expected a c10::Error naming: " << *parts.begin();
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    for (const char* part : parts) EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
}

}  // namespace maxdev::testing
