// Backend metadata of max_device tensors: the string -> bool map that
// torch._utils.set_tensor_metadata() attaches and torch.save()/torch.load()
// carry along (PyTorch's BackendMeta serialization hook for PrivateUse1).
#include <c10/core/TensorImpl.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

namespace maxdev::device {
namespace {

using Metadata = std::unordered_map<std::string, bool>;

// Immutable once attached: a tensor that copies another's metadata may
// share the object.
struct TensorMetadata final : c10::BackendMeta {
  explicit TensorMetadata(Metadata entries) : entries(std::move(entries)) {}
  const Metadata entries;
};

void get_metadata(const at::Tensor& t, Metadata& out) {
  const auto* meta = dynamic_cast<const TensorMetadata*>(t.unsafeGetTensorImpl()->get_backend_meta());
  if (meta != nullptr) out.insert(meta->entries.begin(), meta->entries.end());
}

void set_metadata(const at::Tensor& t, Metadata& entries) {
  t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<TensorMetadata>(entries));
}

const bool registered = [] {
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &get_metadata, &set_metadata);
  return true;
}();

}  // namespace
}  // namespace maxdev::device
