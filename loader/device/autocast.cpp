// Autocast (torch.autocast(device_type="max_device")) of max_device.
//
// The op lists and cast policies PyTorch shares between its accelerator
// backends (ATen/autocast_mode.h; CUDA and XPU register the same): matmuls,
// convolutions, RNN cells and attention run in the autocast dtype, reductions,
// norms and losses in float32, a few ops at the widest input type. Ops not
// listed pass through the autocast key untouched.
#include <ATen/autocast_mode.h>

namespace at::autocast {
namespace {

// As on CUDA: the op saturates in reduced precision; users are pointed at
// the logits form, which autocast runs in float32.
Tensor binary_cross_entropy_refused(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "max_device autocast: torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast; use binary_cross_entropy_with_logits / BCEWithLogitsLoss (float32 under autocast), or "
              "disable autocast around the loss");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define MAXDEV_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(MAXDEV_LOWER_PRECISION_FP)
#define MAXDEV_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(MAXDEV_FP32)
#define MAXDEV_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(MAXDEV_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define MAXDEV_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(MAXDEV_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
}  // namespace at::autocast
