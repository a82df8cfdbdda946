// The thread-local state every plugin call reads, in one block, so that a
// call pays one thread-local access rather than one per module. The block
// uses the initial-exec model: the code reaches it at a fixed offset from
// the thread pointer, with no __tls_get_addr call. A library that dlopen
// loads (this one, through Python) may use that model for a few bytes,
// which glibc takes from its reserve of static TLS.
#pragma once

#include <cstdint>

namespace maxdev {

namespace dispatch {
struct ReaderRecord;
}
namespace device {
class AliasPool;
}

struct ThreadState {
  dispatch::ReaderRecord* reader_record = nullptr;  // dispatch/epoch.h; null until the first call
  int8_t current_device = 0;                        // device/allocator.h (a c10::DeviceIndex)
  device::AliasPool* alias_pool = nullptr;          // device/host_alias.cpp; null until the first alias
  bool alias_pool_closed = false;                   // the thread is exiting: no pool any more
};

extern thread_local constinit ThreadState thread_state __attribute__((tls_model("initial-exec")));

}  // namespace maxdev
