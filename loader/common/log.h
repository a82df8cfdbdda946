// The loader's logger. spdlog lives only in log.cpp: Debian's spdlog uses
// fmt 9 while torch bundles fmt 12, so no translation unit may see both.
#pragma once

#include <string>

namespace maxdev::log {

enum class Level { trace, debug, info, warn, error, off };

void write(Level level, const std::string& message);
inline void trace(const std::string& m) { write(Level::trace, m); }
inline void debug(const std::string& m) { write(Level::debug, m); }
inline void info(const std::string& m) { write(Level::info, m); }
inline void warn(const std::string& m) { write(Level::warn, m); }
inline void error(const std::string& m) { write(Level::error, m); }

// Level names: trace, debug, info, warn, error, off. Throws
// std::invalid_argument on anything else.
Level parse_level(const std::string& name);
void set_level(const std::string& level);
std::string level();

}  // namespace maxdev::log
