// SHA-256 for content-addressed snapshots and sha256= pinning.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace maxdev::plugins {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::string hex_digest();  // finishes the hash

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace maxdev::plugins
