// Random number generators of max_device.
//
// Memory is host RAM and random ops run PyTorch's CPU kernels, which accept
// only CPU generators. So a max_device generator owns a CPU generator (its
// "engine") and the CPU fallback hands that engine to the kernel.
//
// The default max_device generator's engine is the CPU default generator
// itself: some CPU kernels (native_dropout, ...) take no generator argument
// and draw from the CPU default whatever the device, so one stream is the
// only way every random op on max_device follows its seed. Seeding
// max_device therefore seeds the CPU too, and a run on max_device draws the
// same numbers as the same run on the CPU. Generators made with
// torch.Generator(device="max_device") have engines of their own, and so
// do the default generators of max_device:1 and up (ops that take no
// generator argument, such as dropout, draw from the CPU's on every device).
#pragma once

#include <ATen/core/Generator.h>

namespace maxdev::device {

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

// The CPU generator a kernel must use for `generator` (None: the default
// generator of the current device). A generator of another device is an
// error, as on any device.
at::Generator cpu_engine(const std::optional<at::Generator>& generator);

}  // namespace maxdev::device
