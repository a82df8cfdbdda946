"""Throughput of the fast plugin (build/plugins/libfast.so) against PyTorch's
own CPU kernels and the machine's memory bandwidth, in one process:

  copy         a STREAM-like copy (dst.copy_(src), CPU, 2^24 float32): the
               machine's bandwidth, bytes read + written per second
  elementwise  add, mul, gelu at 2^24 float32 (out= variants, so neither
               side pays for page faults of a fresh output); relu
               functional (the CPU's relu.out is a slow composite)
  rows         softmax, log_softmax, layer norm at [4096, 1024]
  gemm         mm 1024^3 float32; bmm and addmm as they occur in a model
  bfloat16     add, softmax and mm in bfloat16, for the record

Each op runs on CPU tensors (cpu), on max_device tensors with the fast
plugin loaded (fast), and without it (fallback: the CPU kernel on the same
bytes). Rounds rotate the variants; each sample is the mean of a block of
calls; times are medians over rounds, p10..p90 spread; the speed (cpu time
/ fast time) is the median of the rounds' own ratios. malloc keeps freed
memory (_benchlib.keep_freed_memory): no variant's fresh output pays page
faults by luck of where it lands. The plugin's call counters
prove that its kernel ran.

    PYTHONPATH=python .venv/bin/python bench/bench_fast.py [--quick] [--threads N]

Writes bench/results/fast.json.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402
import max_device  # noqa: E402

VARIANTS = ("cpu", "fast", "fallback")
ELEMENTWISE_N = 1 << 24
ROWS = (4096, 1024)
GEMM = 1024
# (rounds, calls per block)
FULL = (9, 5)
QUICK = (4, 3)


def cases():
    """name -> (group, bytes moved per call or None, flops or None, make(dev) -> fn, target ratio)."""
    n = ELEMENTWISE_N
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    a, b = rand(n), rand(n)
    x = rand(*ROWS)
    w, bias = rand(ROWS[1]), rand(ROWS[1])
    ma, mb = rand(GEMM, GEMM), rand(GEMM, GEMM)
    ba, bb = rand(32, 128, 64), rand(32, 64, 128)
    lin_x, lin_w, lin_b = rand(2048, 256), rand(1024, 256), rand(1024)
    xb, ab, bb16 = x.bfloat16(), a.bfloat16(), b.bfloat16()
    mab, mbb = ma.bfloat16(), mb.bfloat16()
    f4 = 4

    def on(dev, *ts):
        return [t.to(dev) for t in ts]

    def binary(op):
        def make(dev):
            p, q = on(dev, a, b)
            out = torch.empty_like(p)
            return lambda: op(p, q, out=out)
        return make

    def unary(op):
        def make(dev):
            (p,) = on(dev, a)
            out = torch.empty_like(p)
            return lambda: op(p, out=out)
        return make

    def functional(op):  # relu's out= variant has no CPU kernel of its own (a slow composite)
        def make(dev):
            (p,) = on(dev, a)
            return lambda: op(p)
        return make

    def mm(p, q):
        def make(dev):
            s, t = on(dev, p, q)
            out = torch.empty(s.shape[0], t.shape[1], dtype=s.dtype, device=dev)
            return lambda: torch.mm(s, t, out=out)
        return make

    def bmm(dev):
        s, t = on(dev, ba, bb)
        return lambda: torch.bmm(s, t)

    def linear(dev):
        s, t, u = on(dev, lin_x, lin_w, lin_b)
        return lambda: F.linear(s, t, u)

    def rows(fn, src=x):
        def make(dev):
            (p,) = on(dev, src)
            return lambda: fn(p)
        return make

    def ln(dev):
        p, q, r = on(dev, x, w, bias)
        return lambda: F.layer_norm(p, (ROWS[1],), q, r)

    def ln_backward(dev):
        p, q, r = on(dev, x, w, bias)
        _, mean, rstd = torch.native_layer_norm(p, (ROWS[1],), q, r, 1e-5)
        grad = torch.ones_like(p)
        return lambda: torch.ops.aten.native_layer_norm_backward(grad, p, (ROWS[1],), mean, rstd, q, r,
                                                                 [True, True, True])

    def copy(dev):
        s = a.to(dev)
        d = torch.empty_like(s)
        return lambda: d.copy_(s)

    def add_bf16(dev):
        p, q = on(dev, ab, bb16)
        out = torch.empty_like(p)
        return lambda: torch.add(p, q, out=out)

    gemm_flops = 2 * GEMM ** 3
    rb = ROWS[0] * ROWS[1] * f4
    return {
        "copy 2^24": ("bandwidth", 2 * n * f4, None, copy, None),
        "add 2^24": ("elementwise", 3 * n * f4, None, binary(torch.add), 0.95),
        "mul 2^24": ("elementwise", 3 * n * f4, None, binary(torch.mul), 0.95),
        "relu 2^24": ("elementwise", 2 * n * f4, None, functional(torch.relu), 0.95),
        "gelu 2^24": ("elementwise", 2 * n * f4, None, unary(torch.ops.aten.gelu.out), 0.95),
        "softmax 4096x1024": ("rows", 2 * rb, None, rows(lambda t: torch.softmax(t, -1)), 1.0),
        "log_softmax 4096x1024": ("rows", 2 * rb, None, rows(lambda t: torch.log_softmax(t, -1)), 1.0),
        "layer_norm 4096x1024": ("rows", 2 * rb, None, ln, 1.0),
        "layer_norm backward 4096x1024": ("rows", 3 * rb, None, ln_backward, 1.0),
        "mm 1024^3": ("gemm", None, gemm_flops, mm(ma, mb), 0.9),
        "bmm 32x128x64x128": ("gemm", None, 2 * 32 * 128 * 64 * 128, bmm, None),
        "linear 2048x256->1024": ("gemm", None, 2 * 2048 * 256 * 1024, linear, None),
        "add 2^24 bf16": ("bfloat16", 3 * n * 2, None, add_bf16, None),
        "softmax 4096x1024 bf16": ("bfloat16", 2 * rb // 2, None, rows(lambda t: torch.softmax(t, -1), xb), None),
        "mm 1024^3 bf16": ("bfloat16", None, gemm_flops, mm(mab, mbb), None),
    }


def time_block(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--only", nargs="*", help="case names (substring match)")
    parser.add_argument("--out", help="result file (default bench/results/fast.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kept = bl.keep_freed_memory()
    rounds, calls = QUICK if args.quick else FULL
    max_device.set_log_level("warn")
    path = bl.artifact("plugins", "libfast.so")
    machine, load_start = bl.machine(), bl.loadavg()

    all_cases = cases()
    if args.only:
        all_cases = {k: v for k, v in all_cases.items() if any(o in k for o in args.only)}
    results = {}
    for name, (group, nbytes, flops, make, target) in all_cases.items():
        variants = ("cpu",) if group == "bandwidth" else VARIANTS
        fns = {v: make("cpu" if v == "cpu" else "max_device") for v in variants}
        samples = {v: [] for v in variants}
        served = None
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                plugin = max_device.load_plugin(path) if v == "fast" else None
                try:
                    fns[v]()  # warm: first-touch pages, caches
                    if v == "fast" and served is None:
                        before = sum(e["calls"] for e in plugin_layers())
                        fns[v]()
                        served = sum(e["calls"] for e in plugin_layers()) - before
                    samples[v].append(time_block(fns[v], calls))
                finally:
                    if plugin is not None:
                        max_device.unload_plugin(plugin)
        stats = {v: bl.summarize(s) for v, s in samples.items()}
        med = {v: s["median"] for v, s in stats.items()}
        entry = {"group": group, "bytes": nbytes, "flops": flops, "stats_ns": stats,
                 "samples_ns": samples, "target_ratio": target}
        if "fast" in med:
            # > 1: the plugin is faster. The median of each round's ratio: the
            # two variants run back to back in a round, so a round the machine
            # ran slow for (another VM, a frequency change) cancels out.
            entry["speedup_vs_cpu"] = statistics.median(c / f for c, f in zip(samples["cpu"], samples["fast"]))
            entry["plugin_calls_per_call"] = served
        if nbytes:
            entry["gbytes_per_s"] = {v: nbytes / m for v, m in med.items()}
        if flops:
            entry["gflops"] = {v: flops / m for v, m in med.items()}
        results[name] = entry
        extra = f" fast/cpu speed {entry['speedup_vs_cpu']:.2f}" if "fast" in med else ""
        print(f"  {name}: " + ", ".join(f"{v} {m / 1e6:.2f} ms" for v, m in med.items()) + extra,
              flush=True)

    summary = []
    copy_bw = results.get("copy 2^24", {}).get("gbytes_per_s", {}).get("cpu")
    for name, r in results.items():
        if r.get("target_ratio") is not None:
            t = r["target_ratio"]
            # met only where the plugin's kernel ran (a declined op is the CPU's)
            summary.append({"metric": f"fast plugin speed / cpu, {name}", "value": r["speedup_vs_cpu"],
                            "target": f">= {t}", "ok": r["speedup_vs_cpu"] >= t and r["plugin_calls_per_call"] > 0})
        if r["group"] == "elementwise" and copy_bw:
            frac = r["gbytes_per_s"]["fast"] / copy_bw
            r["fraction_of_copy_bandwidth"] = frac
            summary.append({"metric": f"fast plugin bandwidth / copy bandwidth, {name}", "value": frac,
                            "target": ">= 0.8", "ok": frac >= 0.8})
    report = {"benchmark": "bench_fast", "quick": args.quick, "machine": machine,
              "threads": args.threads, "malloc_keeps_freed_memory": kept,
              "loadavg_start": load_start, "loadavg_end": bl.loadavg(),
              "config": {"rounds": rounds, "calls_per_block": calls}, "results": results,
              "summary": summary}
    out = bl.write_json("fast.json", report, args.out)

    bl.print_machine(machine, args.quick)
    header = f"{'case':26s} {'cpu ms':>9s} {'fast ms':>9s} {'fallback':>9s} {'speed':>6s} {'GB/s|GF':>8s}"
    bl.print_header(header)
    for name, r in results.items():
        s = r["stats_ns"]
        cell = lambda v: f"{s[v]['median'] / 1e6:9.3f}" if v in s else f"{'':9s}"  # noqa: E731
        rate = r.get("gbytes_per_s", r.get("gflops", {}))
        rate_v = rate.get("fast", rate.get("cpu"))
        speed = f"{r['speedup_vs_cpu']:6.2f}" if "speedup_vs_cpu" in r else f"{'':6s}"
        declined = "  declined: the CPU's kernel ran" if r.get("plugin_calls_per_call") == 0 else ""
        print(f"{name:26s} {cell('cpu')} {cell('fast')} {cell('fallback')} {speed} {rate_v:8.1f}{declined}")
    print(f"\nspeed = median over rounds of cpu time / fast time (>= target: met); raw samples: {out}")


def plugin_layers():
    return [layer for e in max_device.list_ops() for layer in e["layers"]
            if layer["kind"] == "plugin" and layer["owner"].startswith("fast@")]


if __name__ == "__main__":
    main()
