// Who serves each op on max_device.
//
// Every op that any provider serves gets one OpSlot with one boxed
// trampoline, registered with the dispatcher once, for the life of the
// process. A call reads the current DispatchTable through one atomic
// pointer and walks the op's provider stack from the top: a provider runs
// the op or declines, and below the last one is the zero-copy CPU fallback.
// Writers build a new table and publish it with one pointer swap, so all
// ops change provider at the same instant; the old table is freed once no
// call can still see it (dispatch/epoch.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/call_args.h"
#include "dispatch/op_signature.h"
#include "dispatch/shared_kernel.h"

namespace torch {
class Library;
}

namespace maxdev::dispatch {

struct OpSlot;

// An op call's returns, in order (one for every op a plugin may serve but
// a few): inline storage, no heap allocation per call.
using Returns = c10::SmallVector<c10::IValue, 2>;

// Whether calls on this thread run against a staged (not yet published)
// table: validation runs, which must not count as the live version's calls.
bool staged_on_this_thread();

// The profiler range of a call a provider serves: "max_device: aten::mm.out
// <- reference@1.0.0 gen 2" (plugin, with its generation), "... <-
// override:label", "... <- cpu fallback". Built once per provider.
std::string served_by_name(const std::string& op, const std::string& provider);

// Opens a range named `name` in torch.profiler's traces (a user-scope
// RecordFunction, as Python's record_function) for the life of this object,
// only while a profiler or another RecordFunction callback listens:
// otherwise it costs the dispatcher's own thread-local check. `name` must
// outlive the object.
class ServedBy {
 public:
  explicit ServedBy(const std::string& name) {
    if (auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE)) {
      range_.emplace(std::move(*callbacks));
      range_->before(std::string_view(name));
    }
  }

 private:
  std::optional<at::RecordFunction> range_;
};

class Provider {
 public:
  // `served_by`: served_by_name() of the op and this provider.
  Provider(std::string owner, std::string kind, std::string served_by)
      : owner_(std::move(owner)), kind_(std::move(kind)), served_by_(std::move(served_by)) {}
  virtual ~Provider() = default;

  // Runs the op (args.slot()) on `args`: appends one value per return to
  // `returns` and returns true; or declines: returns false with `returns`
  // untouched. A return that aliases an argument (in-place, out=) is that
  // argument whatever the provider appends for it: the trampoline makes it.
  // Both trampolines (boxed and unboxed) call this.
  virtual bool run(const CallArgs& args, Returns& returns) = 0;

  // For ops a plugin defines (dispatch/custom_op_kernels.h): runs the op's
  // meta function on meta tensors like run(), or returns false when this
  // provider has none; and the op that computes its gradients ("" for none).
  virtual bool run_meta(const OpSlot&, torch::jit::Stack*) { return false; }
  virtual const std::string& backward_op() const {
    static const std::string none;
    return none;
  }

  const std::string& owner() const { return owner_; }  // "reference@1.0.0"
  const std::string& kind() const { return kind_; }    // "plugin", "override"
  const std::string& served_by() const { return served_by_; }

  // Calls this provider ran and declined while it was live (validation
  // runs of a staged table are not counted).
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> declines{0};
  void count_call() {
    if (!staged_on_this_thread()) calls.fetch_add(1, std::memory_order_relaxed);
  }
  void count_decline() {
    if (!staged_on_this_thread()) declines.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  std::string owner_;
  std::string kind_;
  std::string served_by_;
};

// Bottom to top.
using ProviderStack = std::vector<std::shared_ptr<Provider>>;

struct OpSlot {
  // Defined where torch::Library is complete.
  OpSlot(size_t index, std::string name, c10::OperatorHandle op, OpSignature sig);
  ~OpSlot();

  size_t index;
  std::string name;  // "aten::add.out"
  c10::OperatorHandle op;
  OpSignature sig;
  // The trampoline (dispatch/trampoline.h), kept as long as the slot: a
  // call may still be inside it after its registration ends.
  std::optional<SharedKernel> trampoline;
  std::optional<c10::RegistrationHandleRAII> registration;
  bool unboxed = false;  // the dispatcher calls it with C++ arguments, as a native kernel
  std::unique_ptr<torch::Library> custom_op_kernels;  // Meta and Autograd kernels of a plugin-defined op
  bool has_meta_kernel = false, has_autograd_kernel = false;
  bool has_cpu_kernel = true;  // else a call every provider declines has nowhere to go
  // A trampoline on a CompositeImplicitAutograd op hides PyTorch's
  // decomposition (and the op's gradients): it is removed, and the slot
  // retired, once no provider serves the op (writers only). Every other
  // trampoline stays for the life of the process.
  bool composite_implicit = false;
  bool retired = false;

  // A plugin-defined op outlives its plugins (PyTorch cannot safely drop a
  // schema that Python may hold): once the last plugin serving it is
  // unloaded, calls raise an error naming that plugin. Written by the
  // registry, read only on that error path.
  void set_unserved(std::string plugin, std::string file);
  std::pair<std::string, std::string> unserved() const;  // (plugin, file); empty if served

 private:
  mutable std::mutex unserved_mutex_;
  std::string unserved_plugin_, unserved_file_;
};

struct DispatchTable {
  std::vector<ProviderStack> stacks;  // by OpSlot::index
};

class OpTable {
 public:
  static OpTable& instance();

  // The slot of `op` (an existing op), registering its trampoline on first
  // use. Throws std::invalid_argument when the op cannot be served by a
  // plugin (unknown, natively served by max_device, unpassable schema).
  OpSlot& slot(const std::string& op);

  // The same checks as slot(), without registering anything; returns how
  // the op's arguments cross the ABI.
  OpSignature check(const std::string& op) const;

  // Makes `op` run PyTorch's CPU kernel on the device's bytes where a
  // composite kernel would otherwise win over the fallback: registers the
  // op's trampoline now, whose path with no provider is that CPU kernel, so
  // a plugin kernel can still serve the op and unloading it restores this.
  void route_to_cpu_kernel(const std::string& op);

  // Makes `table` current (one atomic store), waits until no call can see
  // the previous table, then frees it. Callers serialize writes.
  void publish(std::unique_ptr<DispatchTable> table);

  // A copy of the current table, for a writer to edit.
  std::unique_ptr<DispatchTable> copy_current() const;

  std::vector<const OpSlot*> slots() const;

  // The table calls on this thread see (readers use this under a
  // ReadGuard): a staged candidate while one is being validated on this
  // thread, else the published table.
  const DispatchTable* current() const {
    const DispatchTable* staged = staged_table();
    return staged != nullptr ? staged : current_.load(std::memory_order_acquire);
  }

  // While alive, calls on this thread see `table` instead of the published
  // one: a version is validated before anyone else can reach it. The
  // autograd engine's threads working for this thread see it too (it
  // travels in PyTorch's thread-local debug info, which the engine hands
  // them), so a validation's backward passes reach the staged version.
  class Staged {
   public:
    explicit Staged(const DispatchTable* table);
    ~Staged();
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;

   private:
    std::unique_ptr<c10::DebugInfoGuard> guard_;
  };

 private:
  friend bool staged_on_this_thread();
  OpTable();
  struct Checked {
    c10::OperatorHandle handle;
    OpSignature sig;
  };
  Checked validate(const std::string& op) const;  // callers hold slots_mutex_

  mutable std::mutex slots_mutex_;
  std::vector<std::unique_ptr<OpSlot>> slots_;
  // The staged table calls on this thread see, if any. Outside validations
  // (no table staged anywhere) this is one relaxed load.
  static const DispatchTable* staged_table() {
    return staging_.load(std::memory_order_relaxed) == 0 ? nullptr : staged_from_debug_info();
  }
  static const DispatchTable* staged_from_debug_info();
  static inline std::atomic<int> staging_{0};  // Staged objects alive, in any thread
  std::atomic<const DispatchTable*> current_;
  std::unique_ptr<DispatchTable> owned_current_;
};

// Ops max_device serves itself; plugins cannot replace them.
bool is_native_device_op(const std::string& op);

// Raises a typed error from inside a call. `kind` is "kernel" (a plugin
// kernel failed) or "unserved" (a plugin-defined op whose plugins were all
// unloaded). Without a hook it throws a c10::Error; the Python module
// installs one that raises max_device.KernelError / PluginStateError.
using CallErrorHook = void (*)(const char* kind, const std::string& plugin, const std::string& op,
                               const std::string& file, const std::string& message);
void set_call_error_hook(CallErrorHook hook);
[[noreturn]] void throw_call_error(const char* kind, const std::string& plugin, const std::string& op,
                                   const std::string& file, const std::string& message);

}  // namespace maxdev::dispatch
