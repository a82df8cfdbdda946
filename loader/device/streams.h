// Streams and events of max_device.
//
// Kernels run synchronously on the calling thread, so work is complete when
// a call returns. Streams and events still behave like a device's: every
// stream has an id that encodes its priority, each thread has a current
// stream, events get ids and host timestamps (steady clock) when recorded,
// and elapsed_time() is the host time between two records.
#pragma once

#include <c10/core/Stream.h>

namespace maxdev::device {

// Priorities as on CUDA: lower is more urgent; the default stream has 0.
inline constexpr int kLowestStreamPriority = 0;
inline constexpr int kHighestStreamPriority = -1;

int stream_priority(c10::StreamId id);

}  // namespace maxdev::device
