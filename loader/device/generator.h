// Random number generators of max_device.
//
// Memory is host RAM and random ops run PyTorch's CPU kernels, which accept
// only CPU generators. So a max_device generator owns a CPU generator (its
// "engine") and the CPU fallback hands that engine to the kernel: seeding
// the device generator seeds exactly what the kernel draws from, and a run
// on max_device draws the same numbers as a run on the CPU with the same seed.
#pragma once

#include <ATen/core/Generator.h>

namespace maxdev::device {

const at::Generator& default_generator();
at::Generator new_generator();

// The CPU generator a kernel must use for `generator` (None: the default).
at::Generator cpu_engine(const std::optional<at::Generator>& generator);

}  // namespace maxdev::device
