#include "common/thread_state.h"

namespace maxdev {

thread_local constinit ThreadState thread_state __attribute__((tls_model("initial-exec")));

}  // namespace maxdev
