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

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/op_signature.h"

namespace torch {
class Library;
}

namespace maxdev::dispatch {

struct OpSlot;

class Provider {
 public:
  Provider(std::string owner, std::string kind) : owner_(std::move(owner)), kind_(std::move(kind)) {}
  virtual ~Provider() = default;

  // Runs the op: pops its arguments and pushes its returns, and returns
  // true; or declines: returns false with the stack untouched.
  virtual bool run(const OpSlot& slot, torch::jit::Stack* stack) = 0;

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

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> declines{0};

 private:
  std::string owner_;
  std::string kind_;
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
  std::unique_ptr<torch::Library> registration;  // the trampoline
  std::unique_ptr<torch::Library> custom_op_kernels;  // Meta and Autograd kernels of a plugin-defined op
  bool has_meta_kernel = false, has_autograd_kernel = false;
  bool has_cpu_kernel = true;  // else a call every provider declines has nowhere to go
  bool composite_implicit = false;  // its trampoline is removed once no provider serves it
  bool retired = false;  // its op's schema went away; never found again (writers only)
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

  // The same checks as slot(), without registering anything.
  void check(const std::string& op) const;

  // Deregisters the trampoline of a plugin-defined op whose schema is
  // going away; the slot stays (its index is never reused) but is dead.
  void retire(const std::string& op);

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
    const DispatchTable* staged = staged_table;
    return staged != nullptr ? staged : current_.load(std::memory_order_acquire);
  }

  // While alive, calls on this thread see `table` instead of the published
  // one: a version is validated before anyone else can reach it.
  class Staged {
   public:
    explicit Staged(const DispatchTable* table) : previous_(staged_table) { staged_table = table; }
    ~Staged() { staged_table = previous_; }
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;

   private:
    const DispatchTable* previous_;
  };

 private:
  OpTable();
  struct Checked {
    c10::OperatorHandle handle;
    OpSignature sig;
  };
  Checked validate(const std::string& op) const;  // callers hold slots_mutex_

  mutable std::mutex slots_mutex_;
  std::vector<std::unique_ptr<OpSlot>> slots_;
  static inline thread_local const DispatchTable* staged_table = nullptr;
  std::atomic<const DispatchTable*> current_;
  std::unique_ptr<DispatchTable> owned_current_;
};

// Ops max_device serves itself; plugins cannot replace them.
bool is_native_device_op(const std::string& op);

}  // namespace maxdev::dispatch
