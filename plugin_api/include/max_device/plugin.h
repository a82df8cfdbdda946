/*
 * max_device plugin ABI — the only header a kernel plugin needs.
 *
 * A plugin is a shared library that exports exactly one symbol,
 * `maxdev_plugin_entry`, and embeds a manifest (ELF section
 * `.maxdev_manifest`) that the loader reads without running plugin code.
 * It links nothing from PyTorch or from the host: every service it needs
 * (allocating outputs, reporting errors, logging) comes in through
 * `maxdev_host_api`, so one build works with every host of the same ABI
 * major version.
 *
 * Compatibility promise (see CHANGELOG.md beside this header):
 *   - The version is MAJOR.MINOR. A host accepts a plugin whose major equals
 *     its own and whose minor is <= its own, forever within that major.
 *   - Within a major, structs only grow at the end and every struct starts
 *     with its size, so a host can tell which fields an older plugin has.
 *   - The first three fields of `maxdev_plugin_def` (struct_size, abi_major,
 *     abi_minor) are frozen for all majors: a host reads them, and nothing
 *     else, before it refuses a plugin of another major.
 *   - No C++ exception, C++ standard library type, RTTI or thread-local
 *     error state crosses this boundary. Errors are a status code plus a
 *     message the host copies before the call returns.
 *
 * C99, standard headers only. The helpers of the C SDK (max_device/sdk.h:
 * strided iteration, scalars, overlap, dtypes) come with this header.
 */
#ifndef MAX_DEVICE_PLUGIN_H_
#define MAX_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------- */

#define MAXDEV_ABI_MAJOR 1
#define MAXDEV_ABI_MINOR 4

/* The one symbol a plugin exports. */
#define MAXDEV_ENTRY_SYMBOL "maxdev_plugin_entry"

/* ELF section that holds the manifest records. */
#define MAXDEV_MANIFEST_SECTION ".maxdev_manifest"

/* ---------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------- */

typedef enum maxdev_status {
  MAXDEV_OK = 0,       /* the kernel ran and filled its outputs */
  MAXDEV_DECLINED = 1, /* not handled: the call passes to the provider below */
  MAXDEV_ERROR = 2     /* failed: the message given to set_error reaches Python */
} maxdev_status;

/* ---------------------------------------------------------------------------
 * Tensors: field for field the layout of DLPack's DLTensor (v1.x), so a
 * `maxdev_tensor*` can be handed to any DLPack-aware code.
 * ------------------------------------------------------------------------- */

/* Device types (DLPack's DLDeviceType values). */
#define MAXDEV_DEVICE_CPU 1     /* an ordinary CPU tensor (e.g. a 0-dim scalar) */
#define MAXDEV_DEVICE_MAX 12    /* a max_device tensor (kDLExtDev); host memory */

typedef struct maxdev_device {
  int32_t device_type; /* MAXDEV_DEVICE_*; both kinds are host memory */
  int32_t device_id;   /* always 0: max_device has one device */
} maxdev_device;

/* Type codes (DLPack's DLDataTypeCode values). */
#define MAXDEV_TYPE_INT 0
#define MAXDEV_TYPE_UINT 1
#define MAXDEV_TYPE_FLOAT 2
#define MAXDEV_TYPE_BFLOAT 4
#define MAXDEV_TYPE_COMPLEX 5
#define MAXDEV_TYPE_BOOL 6

typedef struct maxdev_dtype {
  uint8_t code;   /* MAXDEV_TYPE_* */
  uint8_t bits;   /* bits per lane: 8, 16, 32, 64 */
  uint16_t lanes; /* always 1 */
} maxdev_dtype;

typedef struct maxdev_tensor {
  void* data;              /* base of the allocation; add byte_offset */
  maxdev_device device;    /* where the bytes live */
  int32_t ndim;            /* number of dimensions; 0 for a scalar */
  maxdev_dtype dtype;      /* element type */
  int64_t* shape;          /* ndim sizes; valid for the call */
  int64_t* strides;        /* ndim strides in elements; never NULL */
  uint64_t byte_offset;    /* first element = (char*)data + byte_offset */
} maxdev_tensor;

/* Capability mask bits: which dtypes a kernel accepts (0 = any). */
#define MAXDEV_DTYPE_BOOL (UINT64_C(1) << 0)
#define MAXDEV_DTYPE_UINT8 (UINT64_C(1) << 1)
#define MAXDEV_DTYPE_INT8 (UINT64_C(1) << 2)
#define MAXDEV_DTYPE_INT16 (UINT64_C(1) << 3)
#define MAXDEV_DTYPE_INT32 (UINT64_C(1) << 4)
#define MAXDEV_DTYPE_INT64 (UINT64_C(1) << 5)
#define MAXDEV_DTYPE_FLOAT16 (UINT64_C(1) << 6)
#define MAXDEV_DTYPE_BFLOAT16 (UINT64_C(1) << 7)
#define MAXDEV_DTYPE_FLOAT32 (UINT64_C(1) << 8)
#define MAXDEV_DTYPE_FLOAT64 (UINT64_C(1) << 9)
#define MAXDEV_DTYPE_COMPLEX64 (UINT64_C(1) << 10)
#define MAXDEV_DTYPE_COMPLEX128 (UINT64_C(1) << 11)

/* Kernel flags: conditions under which the host declines for the kernel,
 * without calling it. They apply to every tensor argument. */
#define MAXDEV_KERNEL_CONTIGUOUS_ONLY (UINT64_C(1) << 0) /* row-major, offset any */
#define MAXDEV_KERNEL_SAME_DTYPE (UINT64_C(1) << 1)      /* all tensors one dtype */
#define MAXDEV_KERNEL_NO_CPU_TENSORS (UINT64_C(1) << 2)  /* no CPU scalar tensors */

/* ---------------------------------------------------------------------------
 * Boxed arguments: one maxdev_value per argument of the op's schema, in
 * schema order (keyword-only arguments included).
 * ------------------------------------------------------------------------- */

typedef enum maxdev_value_kind {
  MAXDEV_VALUE_NONE = 0,        /* an optional argument that is None */
  MAXDEV_VALUE_TENSOR = 1,      /* Tensor, Tensor? that is set */
  MAXDEV_VALUE_INT = 2,         /* int, SymInt, or a Scalar holding an integer */
  MAXDEV_VALUE_FLOAT = 3,       /* float, or a Scalar holding a floating value */
  MAXDEV_VALUE_BOOL = 4,        /* bool, or a Scalar holding a bool */
  MAXDEV_VALUE_INT_LIST = 5,    /* int[], SymInt[] */
  MAXDEV_VALUE_TENSOR_LIST = 6, /* Tensor[] */
  MAXDEV_VALUE_STRING = 7,      /* str (e.g. gelu's approximate) */
  MAXDEV_VALUE_DTYPE = 8,       /* ScalarType (e.g. sum's dtype=) */
  MAXDEV_VALUE_FLOAT_LIST = 9,  /* float[] */
  MAXDEV_VALUE_BOOL_LIST = 10   /* bool[], bool[N] (ABI 1.3; e.g. an output_mask) */
} maxdev_value_kind;

/* Set on a value whose schema type is Scalar, so a kernel can tell
 * `add(x, 2)` from an int-typed argument if it cares. */
#define MAXDEV_VALUE_FLAG_SCALAR 1u

typedef struct maxdev_value {
  int32_t kind;   /* maxdev_value_kind */
  uint32_t flags; /* MAXDEV_VALUE_FLAG_* */
  union {
    const maxdev_tensor* tensor; /* TENSOR: borrowed for the call */
    int64_t i;                   /* INT */
    double f;                    /* FLOAT */
    int32_t b;                   /* BOOL: 0 or 1 */
    const char* string;          /* STRING: NUL-terminated UTF-8 */
    maxdev_dtype dtype;          /* DTYPE */
    struct {
      const int64_t* data;
      int64_t size;
    } int_list;                  /* INT_LIST */
    struct {
      const double* data;
      int64_t size;
    } float_list;                /* FLOAT_LIST */
    struct {
      const uint8_t* data;       /* 0 or 1 per element */
      int64_t size;
    } bool_list;                 /* BOOL_LIST (ABI 1.3) */
    struct {
      const maxdev_tensor* data; /* size consecutive tensors */
      int64_t size;
    } tensor_list;               /* TENSOR_LIST */
  } u;
} maxdev_value;

/* ---------------------------------------------------------------------------
 * The host's services
 * ------------------------------------------------------------------------- */

/* Opaque: identifies one call (or one plugin during init) to the host. */
typedef struct maxdev_host_context maxdev_host_context;

#define MAXDEV_LOG_TRACE 0
#define MAXDEV_LOG_DEBUG 1
#define MAXDEV_LOG_INFO 2
#define MAXDEV_LOG_WARN 3
#define MAXDEV_LOG_ERROR 4

typedef struct maxdev_host_api {
  size_t struct_size; /* sizeof(maxdev_host_api) of the host */
  uint32_t abi_major; /* the host's ABI version */
  uint32_t abi_minor;

  /* Allocate output number `index` of the current call as a contiguous
   * max_device tensor and return a view of it, valid until the kernel
   * returns. Outputs that alias an argument (in-place and out= ops) are
   * filled by the host and must not be allocated. */
  maxdev_status (*alloc_output)(maxdev_host_context* ctx, int32_t index,
                                maxdev_dtype dtype, int32_t ndim,
                                const int64_t* shape,
                                const maxdev_tensor** out);

  /* Record an error message (copied at once); returns MAXDEV_ERROR so a
   * kernel can `return host->set_error(ctx, "...")`. */
  maxdev_status (*set_error)(maxdev_host_context* ctx, const char* message);

  /* Log through the host's logger, tagged with the plugin's name. */
  void (*log)(maxdev_host_context* ctx, int32_t level, const char* message);

  /* ABI 1.1 (check MAXDEV_HOST_HAS(host, resize_output) first).
   * Resize output number `index`, an argument the kernel writes into (an
   * out= tensor), to `shape` the way PyTorch's own out= kernels do: an
   * explicit out= reaches the kernel as the user passed it (e.g.
   * torch.empty(0)), so a kernel calls this with the shape it will write.
   * A tensor of another shape that is not empty is resized with PyTorch's
   * deprecation warning, as on the CPU. An out= tensor that is also an
   * input (mul.out(x, x, y)) is never resized: another shape fails, and a
   * kernel that then fails raises PyTorch's own error, as the CPU does. Stores the resized view in
   * *out (and in call->outputs[index]); the argument's view in call->args
   * is stale afterwards. Contiguous if the tensor was reallocated. */
  maxdev_status (*resize_output)(maxdev_host_context* ctx, int32_t index,
                                 int32_t ndim, const int64_t* shape,
                                 const maxdev_tensor** out);

  /* ABI 1.2 (check MAXDEV_HOST_HAS(host, parallel_for) first).
   * Run body(user, b, e) over subranges [b, e) that together cover
   * [begin, end), on the host's intra-op thread pool (PyTorch's
   * at::parallel_for: torch.set_num_threads decides how many threads), and
   * return when all have finished. No subrange is shorter than `grain`
   * (except the last); a range of at most `grain` elements, or a call from
   * inside a parallel region, runs on the calling thread. The body runs
   * concurrently with itself, must not call the host's other functions
   * (num_threads excepted) and must not unwind (C++ exceptions stay inside
   * it). */
  void (*parallel_for)(maxdev_host_context* ctx, int64_t begin, int64_t end,
                       int64_t grain,
                       void (*body)(void* user, int64_t begin, int64_t end),
                       void* user);

  /* ABI 1.4 (check MAXDEV_HOST_HAS(host, num_threads) first).
   * How many threads a parallel_for from the calling thread may run on:
   * torch.get_num_threads(), or 1 inside a parallel region (a parallel_for
   * body included: its parallel_for runs serially). A range split
   * into a multiple of this many equal tasks keeps every thread busy to
   * the end; parallel_for gives each thread one contiguous run of
   * ceil(tasks / num_threads) of them. */
  int32_t (*num_threads)(maxdev_host_context* ctx);
} maxdev_host_api;

/* Whether the host's function table has `field` (a function added in a
 * minor version after 1.0). */
#define MAXDEV_HOST_HAS(host, field)                                \
  ((host)->struct_size >= offsetof(maxdev_host_api, field) +        \
                              sizeof((host)->field) &&              \
   (host)->field != NULL)

/* ---------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------- */

typedef struct maxdev_call {
  size_t struct_size;            /* sizeof(maxdev_call) of the host */
  const maxdev_host_api* host;   /* the host's services */
  maxdev_host_context* ctx;      /* pass to every host function */
  void* plugin_state;            /* what the plugin's init stored, or NULL */
  const maxdev_value* args;      /* num_args values in schema order */
  int32_t num_args;
  int32_t num_outputs;           /* tensors the op returns */
  const maxdev_tensor* const* outputs; /* outputs[i]: set for aliasing
                                  outputs before the call, by alloc_output
                                  otherwise */
} maxdev_call;

typedef maxdev_status (*maxdev_kernel_fn)(const maxdev_call* call);

typedef struct maxdev_kernel_def {
  size_t struct_size;  /* sizeof(maxdev_kernel_def) */
  const char* op;      /* "aten::add.out", "aten::relu", "myplug::rms_norm" */
  const char* schema;  /* full schema for an op this plugin defines, in its
                          own namespace; "" for an existing op */
  maxdev_kernel_fn fn; /* never NULL */
  uint64_t dtypes;     /* MAXDEV_DTYPE_* mask of accepted dtypes; 0 = any */
  uint64_t flags;      /* MAXDEV_KERNEL_* */

  /* ABI 1.1, both optional (NULL), for ops this plugin defines only. */
  /* Meta (shape) function: called with the same arguments as fn, but its
   * tensors carry shapes, strides and dtypes and no data (data == NULL).
   * It calls alloc_output for every output with the shape and dtype fn
   * would produce, and computes nothing. FakeTensor, torch.compile and
   * torch.library.opcheck trace the op through it. */
  maxdev_kernel_fn meta;
  /* Autograd link: the name of an op this plugin also serves that computes
   * the gradients, e.g. "myplug::swiglu_backward". Its arguments are the
   * gradient of each output, then the forward's arguments; it returns one
   * tensor per Tensor argument of the forward, in order (an undefined or
   * zero tensor where there is none). First-order gradients only. */
  const char* backward;
} maxdev_kernel_def;

/* ---------------------------------------------------------------------------
 * The plugin
 * ------------------------------------------------------------------------- */

typedef struct maxdev_plugin_def {
  size_t struct_size;  /* frozen field: sizeof(maxdev_plugin_def) */
  uint32_t abi_major;  /* frozen field: MAXDEV_ABI_MAJOR built against */
  uint32_t abi_minor;  /* frozen field: MAXDEV_ABI_MINOR built against */
  const char* name;    /* [A-Za-z0-9_]+, unique among loaded plugins */
  const char* version; /* free-form, e.g. "1.2.0" */
  const maxdev_kernel_def* kernels; /* num_kernels kernels */
  int64_t num_kernels;
  /* Optional (NULL = none). init runs once after negotiation, before any
   * kernel; its *state is handed to every kernel as call->plugin_state. */
  maxdev_status (*init)(const maxdev_host_api* host, maxdev_host_context* ctx,
                        void** state);
  /* Optional. Runs once when the plugin is retired, after its last call. */
  void (*teardown)(void* state);
} maxdev_plugin_def;

/* The entry point: return the plugin's definition (static data). It must
 * not register anything or keep `host`; it may refuse a host it cannot
 * work with by returning MAXDEV_ERROR. */
typedef maxdev_status (*maxdev_plugin_entry_fn)(const maxdev_host_api* host,
                                                const maxdev_plugin_def** out);

/* ---------------------------------------------------------------------------
 * Manifest: fixed-size records in section .maxdev_manifest, readable without
 * loading the library. One PLUGIN record, then one KERNEL record per kernel.
 * ------------------------------------------------------------------------- */

#define MAXDEV_MANIFEST_MAGIC 0x4d44584du /* "MXDM" little-endian */
#define MAXDEV_MANIFEST_PLUGIN 1u
#define MAXDEV_MANIFEST_KERNEL 2u
#define MAXDEV_MANIFEST_NAME_SIZE 128
#define MAXDEV_MANIFEST_TEXT_SIZE 512

typedef struct maxdev_manifest_record {
  uint32_t magic;       /* MAXDEV_MANIFEST_MAGIC */
  uint32_t record_size; /* sizeof(maxdev_manifest_record) of the writer */
  uint32_t kind;        /* MAXDEV_MANIFEST_PLUGIN or _KERNEL */
  uint16_t abi_major;   /* PLUGIN: ABI built against */
  uint16_t abi_minor;
  uint64_t dtypes;      /* KERNEL: maxdev_kernel_def.dtypes */
  uint64_t flags;       /* KERNEL: maxdev_kernel_def.flags */
  char name[MAXDEV_MANIFEST_NAME_SIZE]; /* PLUGIN: name; KERNEL: op */
  char text[MAXDEV_MANIFEST_TEXT_SIZE]; /* PLUGIN: version; KERNEL: schema */
} maxdev_manifest_record;

/* ---------------------------------------------------------------------------
 * Defining a plugin in one place. List the kernels once as an X-macro:
 *
 *   #define MY_KERNELS(K)                                              \
 *     K("aten::relu", "", relu_kernel, MAXDEV_DTYPE_FLOAT32, 0)        \
 *     K("aten::add.out", "", add_out_kernel, MAXDEV_DTYPE_FLOAT32,     \
 *       MAXDEV_KERNEL_CONTIGUOUS_ONLY)
 *   MAXDEV_DEFINE_PLUGIN("myplugin", "1.0.0", MY_KERNELS, NULL, NULL)
 *
 * and the macro writes the kernel table, the manifest and the entry point
 * from that one list, so the two can never disagree. A kernel of an op the
 * plugin defines may add its meta function and backward op (ABI 1.1):
 *
 *     K("myplug::swiglu", "myplug::swiglu(Tensor gate, Tensor up) -> Tensor",
 *       swiglu, MAXDEV_DTYPE_FLOAT32, 0, swiglu_meta,
 *       "myplug::swiglu_backward")
 * ------------------------------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
#define MAXDEV_EXPORT __attribute__((visibility("default")))
#define MAXDEV_SECTION_ATTR \
  __attribute__((section(MAXDEV_MANIFEST_SECTION), used, aligned(8)))
#else
#error "max_device plugins need GCC or Clang (ELF sections, visibility)"
#endif

#ifdef __cplusplus
#define MAXDEV_EXTERN_C extern "C"
#else
#define MAXDEV_EXTERN_C
#endif

/* A kernel entry has 5 fields, 6 (+ meta) or 7 (+ meta, backward). */
#define MAXDEV_PICK_8TH_(a, b, c, d, e, f, g, name, ...) name
#define MAXDEV_KERNEL_DEF5_(op, schema, fn, dtypes, flags) \
  {sizeof(maxdev_kernel_def), op, schema, fn, dtypes, flags, NULL, NULL},
#define MAXDEV_KERNEL_DEF6_(op, schema, fn, dtypes, flags, meta) \
  {sizeof(maxdev_kernel_def), op, schema, fn, dtypes, flags, meta, NULL},
#define MAXDEV_KERNEL_DEF7_(op, schema, fn, dtypes, flags, meta, backward) \
  {sizeof(maxdev_kernel_def), op, schema, fn, dtypes, flags, meta, backward},
#define MAXDEV_KERNEL_DEF_(...)                                          \
  MAXDEV_PICK_8TH_(__VA_ARGS__, MAXDEV_KERNEL_DEF7_, MAXDEV_KERNEL_DEF6_, \
                   MAXDEV_KERNEL_DEF5_, unused)(__VA_ARGS__)

#define MAXDEV_MANIFEST_RECORD_(op, schema, fn, dtypes, flags, ...)      \
  {MAXDEV_MANIFEST_MAGIC, sizeof(maxdev_manifest_record),               \
   MAXDEV_MANIFEST_KERNEL, 0, 0, dtypes, flags, op, schema},
#define MAXDEV_MANIFEST_KERNEL_(...) MAXDEV_MANIFEST_RECORD_(__VA_ARGS__, 0)

#define MAXDEV_DEFINE_PLUGIN(name, version, KERNELS, init_fn, teardown_fn) \
  static const maxdev_kernel_def maxdev_kernels_[] = {                     \
      KERNELS(MAXDEV_KERNEL_DEF_)};                                        \
  static const maxdev_manifest_record maxdev_manifest_[]                   \
      MAXDEV_SECTION_ATTR = {                                              \
          {MAXDEV_MANIFEST_MAGIC, sizeof(maxdev_manifest_record),          \
           MAXDEV_MANIFEST_PLUGIN, MAXDEV_ABI_MAJOR, MAXDEV_ABI_MINOR, 0,  \
           0, name, version},                                              \
          KERNELS(MAXDEV_MANIFEST_KERNEL_)};                               \
  static const maxdev_plugin_def maxdev_plugin_def_ = {                    \
      sizeof(maxdev_plugin_def),                                           \
      MAXDEV_ABI_MAJOR,                                                    \
      MAXDEV_ABI_MINOR,                                                    \
      name,                                                                \
      version,                                                             \
      maxdev_kernels_,                                                     \
      (int64_t)(sizeof(maxdev_kernels_) / sizeof(maxdev_kernels_[0])),     \
      init_fn,                                                             \
      teardown_fn};                                                        \
  MAXDEV_EXTERN_C MAXDEV_EXPORT maxdev_status maxdev_plugin_entry(         \
      const maxdev_host_api* host, const maxdev_plugin_def** out) {        \
    (void)maxdev_manifest_;                                                \
    if (host == NULL || out == NULL || host->abi_major != MAXDEV_ABI_MAJOR) \
      return MAXDEV_ERROR;                                                 \
    *out = &maxdev_plugin_def_;                                            \
    return MAXDEV_OK;                                                      \
  }

/* ---------------------------------------------------------------------------
 * Small helpers for C kernels
 * ------------------------------------------------------------------------- */

/* Pointer to the first element of t. */
static inline void* maxdev_tensor_data(const maxdev_tensor* t) {
  return (char*)t->data + t->byte_offset;
}

/* Number of elements of t. */
static inline int64_t maxdev_tensor_numel(const maxdev_tensor* t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* Whether t is row-major contiguous (size-1 dimensions ignored). */
static inline int maxdev_tensor_is_contiguous(const maxdev_tensor* t) {
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

/* Whether t has the given dtype. */
static inline int maxdev_dtype_is(maxdev_dtype dtype, uint8_t code,
                                  uint8_t bits) {
  return dtype.code == code && dtype.bits == bits && dtype.lanes == 1;
}

/* A Scalar argument as a double (INT, FLOAT or BOOL). */
static inline double maxdev_value_as_double(const maxdev_value* v) {
  switch (v->kind) {
    case MAXDEV_VALUE_INT: return (double)v->u.i;
    case MAXDEV_VALUE_FLOAT: return v->u.f;
    case MAXDEV_VALUE_BOOL: return (double)v->u.b;
    default: return 0.0;
  }
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#include "max_device/sdk.h"

#endif /* MAX_DEVICE_PLUGIN_H_ */
