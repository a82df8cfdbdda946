#include "dispatch/op_signature.h"

#include <ATen/core/jit_type.h>

namespace maxdev::dispatch {
namespace {

std::optional<ArgKind> kind_of(const c10::TypePtr& type) {
  using K = c10::TypeKind;
  switch (type->kind()) {
    case K::TensorType: return ArgKind::tensor;
    case K::IntType:
    case K::SymIntType: return ArgKind::int_;
    case K::FloatType: return ArgKind::float_;
    case K::BoolType: return ArgKind::bool_;
    case K::NumberType: return ArgKind::scalar;
    case K::StringType: return ArgKind::string;
    case K::ScalarTypeType: return ArgKind::dtype;
    case K::ListType: {
      const auto element = type->castRaw<c10::ListType>()->getElementType();
      switch (element->kind()) {
        case K::IntType:
        case K::SymIntType: return ArgKind::int_list;
        case K::FloatType: return ArgKind::float_list;
        case K::BoolType: return ArgKind::bool_list;
        case K::TensorType: return ArgKind::tensor_list;
        default: return std::nullopt;
      }
    }
    default: return std::nullopt;
  }
}

bool same_alias_set(const c10::AliasInfo* a, const c10::AliasInfo* b) {
  return a != nullptr && b != nullptr && a->beforeSets() == b->beforeSets();
}

}  // namespace

SignatureResult plan_signature(const c10::FunctionSchema& schema) {
  OpSignature sig;
  sig.name = schema.operator_name().name +
             (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  for (const auto& arg : schema.arguments()) {
    c10::TypePtr type = arg.real_type();
    bool optional = false;
    if (auto opt = type->cast<c10::OptionalType>()) {
      type = opt->getElementType();
      optional = true;
    }
    auto kind = kind_of(type);
    if (!kind) {
      return {std::nullopt, "argument '" + arg.name() + "' has type " + arg.real_type()->str() +
                                ", which the plugin ABI cannot pass"};
    }
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    sig.args.push_back({*kind, optional, written});
  }
  for (const auto& ret : schema.returns()) {
    if (ret.real_type()->kind() != c10::TypeKind::TensorType) {
      return {std::nullopt, "it returns " + ret.real_type()->str() +
                                "; plugin kernels can return only Tensors"};
    }
    int alias = -1;
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      if (same_alias_set(ret.alias_info(), schema.arguments()[i].alias_info())) alias = static_cast<int>(i);
    }
    if (ret.alias_info() != nullptr && alias < 0) {
      return {std::nullopt, "it returns a view of its input, which plugin kernels cannot create"};
    }
    sig.return_aliases.push_back(alias);
  }
  return {std::move(sig), {}};
}

uint32_t abi_minor_needed(const OpSignature& sig) {
  for (const auto& arg : sig.args) {
    if (arg.kind == ArgKind::bool_list) return 3;
  }
  return 0;
}

}  // namespace maxdev::dispatch
