// What PyTorch needs around an op a plugin defines, besides its PrivateUse1
// trampoline: a Meta kernel (FakeTensor, torch.compile and opcheck trace the
// op through the serving plugin's meta function) and an Autograd kernel (the
// op's gradients come from the backward op the serving plugin names). Both
// read the op's provider stack at call time, so a reload that changes the
// meta function or the backward op takes effect with the new version.
#pragma once

#include "dispatch/op_table.h"

namespace maxdev::dispatch {

// Registers the Meta kernel (when `meta`) and the Autograd kernel (when
// `autograd`) of the plugin-defined op of `slot`, once each; they live as
// long as the slot's registration (OpTable::retire removes them).
void add_custom_op_kernels(OpSlot& slot, bool meta, bool autograd);

}  // namespace maxdev::dispatch
