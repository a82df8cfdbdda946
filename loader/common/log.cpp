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
  // capture alike. MAX_DEVICE_LOG_LEVEL sets the level before first use.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = spdlog::stderr_color_mt("max_device");
    made->set_pattern("[max_device] [%l] %v");
    made->set_level(spdlog::level::info);
    if (const char* env = std::getenv("MAX_DEVICE_LOG_LEVEL")) {
      auto parsed = spdlog::level::from_str(env);
      if (parsed != spdlog::level::off || std::string(env) == "off") made->set_level(parsed);
    }
    return made;
  }();
  return *instance;
}

}  // namespace

void write(Level level, const std::string& message) {
  static constexpr spdlog::level::level_enum kSpdlog[] = {
      spdlog::level::trace, spdlog::level::debug, spdlog::level::info,
      spdlog::level::warn,  spdlog::level::err,   spdlog::level::off};
  logger().log(kSpdlog[static_cast<int>(level)], message);
}

void set_level(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw std::invalid_argument("unknown log level '" + level +
                                "' (expected trace, debug, info, warn, error or off)");
  }
  logger().set_level(parsed);
}

std::string level() {
  auto name = spdlog::level::to_string_view(logger().level());
  return std::string(name.data(), name.size());
}

}  // namespace maxdev::log
