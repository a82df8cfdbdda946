// Built without torch's include path (see loader/CMakeLists.txt): this file
// sees Debian's spdlog and fmt 9 only.
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <stdexcept>

namespace maxdev::log {
namespace {

spdlog::logger& logger() {
  // stderr reaches the user in a terminal, a notebook's log and pytest's
  // capture alike.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = spdlog::stderr_color_mt("max_device");
    made->set_pattern("[max_device] [%l] %v");
    made->set_level(spdlog::level::info);
    return made;
  }();
  return *instance;
}

}  // namespace

constexpr std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
    {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
    {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off}};

void write(Level level, const std::string& message) {
  logger().log(kLevels[static_cast<int>(level)].second, message);
}

Level parse_level(const std::string& name) {
  for (size_t i = 0; i < std::size(kLevels); ++i) {
    if (name == kLevels[i].first) return static_cast<Level>(i);
  }
  throw std::invalid_argument("unknown log level '" + name +
                              "' (expected trace, debug, info, warn, error or off)");
}

void set_level(const std::string& level) { logger().set_level(kLevels[static_cast<int>(parse_level(level))].second); }

namespace {
// MAX_DEVICE_LOG_LEVEL applies at load time; a bad value is reported, not fatal.
const bool env_applied = [] {
  if (const char* env = std::getenv("MAX_DEVICE_LOG_LEVEL")) {
    try {
      set_level(env);
    } catch (const std::invalid_argument& e) {
      logger().warn("MAX_DEVICE_LOG_LEVEL: {}", e.what());
    }
  }
  return true;
}();
}  // namespace

std::string level() {
  for (const auto& [name, value] : kLevels) {
    if (logger().level() == value) return name;
  }
  return "info";
}

}  // namespace maxdev::log
