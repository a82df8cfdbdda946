/* The plugin side of bench_plugin_call.py's plugin / native comparison:
 * aten::add.out with exactly bench/native_add_kernel.cpp's body (float32,
 * equal shapes, contiguous: out[i] = a[i] + alpha * b[i]; anything else
 * declined), so the two variants differ only in what reaches the body: the
 * loader's trampoline and the C ABI against a TORCH_LIBRARY_IMPL kernel.
 * (The reference plugin's add, the other plugin variant, handles
 * broadcasting, strides, dtypes and overlap: ~1,000 more instructions per
 * call than this loop at 64 elements.) The dtype and contiguity
 * conditions are the kernel's declared capabilities, which the loader
 * checks from flags decoded at load time. */
#include <max_device/plugin.h>

#include <string.h>

static maxdev_status add_out(const maxdev_call* c) {
  if (c->num_args != 4 || c->num_outputs != 1 || c->args[0].kind != MAXDEV_VALUE_TENSOR ||
      c->args[1].kind != MAXDEV_VALUE_TENSOR)
    return MAXDEV_DECLINED;
  const maxdev_tensor* x = c->args[0].u.tensor;
  const maxdev_tensor* y = c->args[1].u.tensor;
  const maxdev_tensor* o = c->outputs[0];
  const size_t shape_bytes = (size_t)x->ndim * sizeof(int64_t);
  if (y->ndim != x->ndim || o->ndim != x->ndim || memcmp(x->shape, y->shape, shape_bytes) != 0 ||
      memcmp(x->shape, o->shape, shape_bytes) != 0)
    return MAXDEV_DECLINED;
  const float alpha = (float)maxdev_value_as_double(&c->args[2]);
  const float* a = (const float*)maxdev_tensor_data(x);
  const float* b = (const float*)maxdev_tensor_data(y);
  float* out = (float*)maxdev_tensor_data(o);
  const int64_t n = maxdev_tensor_numel(x);
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + alpha * b[i];
  return MAXDEV_OK;
}

#define SAME_LOOP_KERNELS(K)                                                     \
  K("aten::add.out", "", add_out, MAXDEV_DTYPE_FLOAT32,                          \
    MAXDEV_KERNEL_CONTIGUOUS_ONLY | MAXDEV_KERNEL_SAME_DTYPE | MAXDEV_KERNEL_NO_CPU_TENSORS)

MAXDEV_DEFINE_PLUGIN("same_loop_add", "1.0.0", SAME_LOOP_KERNELS, NULL, NULL)
