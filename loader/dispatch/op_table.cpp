#include "dispatch/op_table.h"

#include <torch/library.h>

#include <algorithm>
#include <stdexcept>

#include "common/log.h"
#include "dispatch/cpu_fallback.h"
#include "dispatch/epoch.h"
#include "dispatch/trampoline.h"

namespace maxdev::dispatch {
namespace {

constexpr const char* kNativeOps[] = {
    "aten::empty.memory_format", "aten::empty_strided", "aten::as_strided", "aten::view",
    "aten::_reshape_alias", "aten::resize_", "aten::set_", "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor", "aten::_copy_from",
    "aten::_copy_from_and_resize", "aten::_local_scalar_dense", "aten::convolution_overrideable",
    "aten::convolution_backward_overrideable", "aten::_thnn_fused_lstm_cell",
    "aten::_thnn_fused_lstm_cell_backward_impl", "aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward"};

std::pair<std::string, std::string> split_name(const std::string& op) {
  const auto dot = op.find('.', op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

}  // namespace

OpSlot::OpSlot(size_t index, std::string name, c10::OperatorHandle op, OpSignature sig)
    : index(index), name(std::move(name)), op(std::move(op)), sig(std::move(sig)) {}
OpSlot::~OpSlot() = default;

void OpSlot::set_unserved(std::string plugin, std::string file) {
  std::lock_guard lock(unserved_mutex_);
  unserved_plugin_ = std::move(plugin);
  unserved_file_ = std::move(file);
}

std::pair<std::string, std::string> OpSlot::unserved() const {
  std::lock_guard lock(unserved_mutex_);
  return {unserved_plugin_, unserved_file_};
}

std::string served_by_name(const std::string& op, const std::string& provider) {
  return "max_device: " + op + " <- " + provider;
}

bool staged_on_this_thread() { return OpTable::staged_table() != nullptr; }

namespace {
constexpr std::string_view kStagedTableName = "max_device staged dispatch table";
const c10::DebugInfoKind kStagedTable(&kStagedTableName);

struct StagedTableInfo final : c10::DebugInfoBase {
  explicit StagedTableInfo(const DispatchTable* table) : table(table) {}
  const DispatchTable* table;
};
}  // namespace

OpTable::Staged::Staged(const DispatchTable* table)
    : guard_(std::make_unique<c10::DebugInfoGuard>(kStagedTable, std::make_shared<StagedTableInfo>(table))) {
  staging_.fetch_add(1, std::memory_order_relaxed);
}

OpTable::Staged::~Staged() {
  guard_.reset();
  staging_.fetch_sub(1, std::memory_order_relaxed);
}

const DispatchTable* OpTable::staged_from_debug_info() {
  const auto* info = static_cast<const StagedTableInfo*>(c10::ThreadLocalDebugInfo::get(kStagedTable));
  return info != nullptr ? info->table : nullptr;
}

namespace {
std::atomic<CallErrorHook> call_error_hook{nullptr};
}  // namespace

void set_call_error_hook(CallErrorHook hook) { call_error_hook = hook; }

void throw_call_error(const char* kind, const std::string& plugin, const std::string& op, const std::string& file,
                      const std::string& message) {
  if (auto hook = call_error_hook.load()) hook(kind, plugin, op, file, message);
  TORCH_CHECK(false, "plugin '", plugin, "', op ", op, " (", file, "): ", message);
}

bool is_native_device_op(const std::string& op) {
  return std::find_if(std::begin(kNativeOps), std::end(kNativeOps),
                      [&](const char* n) { return op == n; }) != std::end(kNativeOps);
}

OpTable& OpTable::instance() {
  static OpTable table;
  return table;
}

OpTable::OpTable() : owned_current_(std::make_unique<DispatchTable>()) {
  current_.store(owned_current_.get());
}

OpTable::Checked OpTable::validate(const std::string& op) const {
  if (is_native_device_op(op)) {
    throw std::invalid_argument("is served natively by max_device and cannot be replaced by a plugin");
  }
  const auto [name, overload] = split_name(op);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) throw std::invalid_argument("is not an operator PyTorch knows (no schema named " + op + ")");
  if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) && !is_direct_fallback(op)) {
    throw std::invalid_argument("already has a PrivateUse1 kernel registered outside max_device");
  }
  auto plan = plan_signature(handle->schema());
  if (!plan.signature) throw std::invalid_argument("cannot be served by a plugin: " + plan.why_not);
  return {*handle, std::move(*plan.signature)};
}

OpSignature OpTable::check(const std::string& op) const {
  std::lock_guard lock(slots_mutex_);
  for (const auto& s : slots_) {
    if (!s->retired && s->name == op) return s->sig;
  }
  return validate(op).sig;
}

OpSlot& OpTable::slot(const std::string& op) {
  std::lock_guard lock(slots_mutex_);
  for (auto& s : slots_) {
    if (!s->retired && s->name == op) return *s;
  }
  Checked checked = validate(op);
  end_direct_fallbacks(op);
  auto slot = std::make_unique<OpSlot>(slots_.size(), op, checked.handle, std::move(checked.sig));
  slot->has_cpu_kernel = checked.handle.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  slot->composite_implicit = checked.handle.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  auto registered = register_trampoline(slot.get(), &slot->unboxed);
  slot->trampoline.emplace(std::move(registered.kernel));
  slot->registration.emplace(std::move(registered.registration));
  log::debug(std::string(slot->unboxed ? "unboxed" : "boxed") + " trampoline registered for " + op);
  slots_.push_back(std::move(slot));
  return *slots_.back();
}

void OpTable::route_to_cpu_kernel(const std::string& op) {
  if (!slot(op).has_cpu_kernel) throw std::logic_error(op + " has no CPU kernel to route to");
}

std::unique_ptr<DispatchTable> OpTable::copy_current() const {
  auto copy = std::make_unique<DispatchTable>(*current());
  std::lock_guard lock(slots_mutex_);
  copy->stacks.resize(slots_.size());
  return copy;
}

void OpTable::publish(std::unique_ptr<DispatchTable> table) {
  std::unique_ptr<DispatchTable> retired = std::move(owned_current_);
  owned_current_ = std::move(table);
  current_.store(owned_current_.get(), std::memory_order_release);
  synchronize();
  retired.reset();  // no call can see it any more
  // A trampoline on a CompositeImplicitAutograd op (allowed by
  // allow_composite) hides PyTorch's decomposition, and with it the op's
  // gradients: it goes as soon as no provider serves the op.
  std::lock_guard lock(slots_mutex_);
  for (auto& s : slots_) {
    if (s->retired || !s->composite_implicit) continue;
    if (s->index < owned_current_->stacks.size() && !owned_current_->stacks[s->index].empty()) continue;
    s->registration.reset();
    s->retired = true;
    log::debug("trampoline removed for " + s->name + " (composite implicit, no provider left)");
  }
}

std::vector<const OpSlot*> OpTable::slots() const {
  std::lock_guard lock(slots_mutex_);
  std::vector<const OpSlot*> out;
  for (const auto& s : slots_) {
    if (!s->retired) out.push_back(s.get());
  }
  return out;
}

}  // namespace maxdev::dispatch
