"""Per-call cost of `torch.add(a, b)` on 64 float32 elements, from Python,
through four providers of aten::add.out on max_device (PyTorch's structured
composite for add.Tensor allocates the output and calls add.out):

  plugin       the reference plugin's kernel (a general strided, broadcasting
               kernel), through the loader's trampoline and the C plugin ABI
  same_loop    a plugin whose add.out is exactly the native kernel's float
               loop (bench/same_loop_add_plugin.c), through the same path:
               same_loop / native is the loader's and the ABI's cost alone
  native       that float loop as a TORCH_LIBRARY_IMPL(aten, PrivateUse1)
               kernel (bench/native_add_kernel.cpp, torch.ops.load_library),
               the floor for a PrivateUse1 kernel
  python       a Python kernel registered with torch.library.impl on the
               device key (the RFC-0046 approach); its body adds through
               zero-copy CPU views of the device bytes
  python_noop  the same registration with an empty body (returns `out`
               unfilled): what the Python route costs before any work
  cpu          stock CPU eager torch.add on CPU tensors

  fallback     no kernel: the loader's zero-copy CPU fallback (sweep only)

Each variant runs in its own subprocess (registrations are process-wide).
A worker warms up, then times blocks of calls; the parent runs the workers
in several rounds, rotating their order, and reports the median per-call
time over all blocks. Every worker checks its result and proves that its
kernel ran (plugins: list_ops() call counter; native: the kernel's own
counter; python: a Python counter). When <build>/bench/bench_call_path
exists, the same path is timed from C++ too (no Python), plus the plugin
kernel called directly through the C ABI. The C++ target (same-loop minus
native) is read on paired runs: the two back to back in many short
processes, the median of the pairs' differences.

Then the per-op overhead sweep: the same torch.add from 1 to 2^24 elements
(powers of 4) for plugin, native, python, cpu and fallback, one process per
variant running every size; each size's calls per block are set from one
timed call so that a block lasts about the same at every size.

    PYTHONPATH=python .venv/bin/python bench/bench_plugin_call.py [--quick]

Writes bench/results/plugin_call.json (raw per-block samples, machine).
"""

import argparse
import ctypes
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

NUMEL = 64
VARIANTS = ("plugin", "same_loop", "native", "python", "python_noop", "cpu")
PLUGIN_FILES = {"plugin": ("plugins", "libreference.so"), "same_loop": ("bench", "libsame_loop_add.so")}
CPP_MODES = ("plugin", "same_loop", "native", "cpu", "kernel", "loop")
# The call path's target is on the same loop: the reference kernel's body
# costs more than the native loop's by itself.
TARGETS = {"same_loop_over_native_max": 1.05}
# (rounds, blocks per worker, calls per block, warmup calls)
FULL = (4, 20, 2000, 2000)
QUICK = (2, 8, 1000, 1000)
# Paired C++ runs of native and same-loop (run_cpp_pairs).
PAIRS_FULL = 24
PAIRS_QUICK = 10
SWEEP_VARIANTS = ("plugin", "native", "python", "cpu", "fallback")
SWEEP_SIZES = tuple(4 ** k for k in range(13))  # 1 .. 2^24 elements
SWEEP_SUMMARY_SIZES = (1, 64, 4096, 4 ** 9, 4 ** 12)
# (blocks per size, nanoseconds per block)
SWEEP_FULL = (9, 20_000_000)
SWEEP_QUICK = (3, 2_000_000)


# ---------------------------------------------------------------------------
# Worker: one variant, one process
# ---------------------------------------------------------------------------

def _host_view(t):
    """A CPU tensor over the bytes of a contiguous float32 max_device tensor."""
    buf = (ctypes.c_float * t.numel()).from_address(t.data_ptr())
    return torch.frombuffer(buf, dtype=torch.float32)


def setup(variant: str):
    """Registers the variant's kernel in this process: (info, calls_now), where
    calls_now() counts the calls the kernel under test has run (None: CPU)."""
    import max_device

    dev = max_device.DEVICE_NAME
    info = {"variant": variant}
    calls_now = None

    if variant in PLUGIN_FILES:
        plugin = max_device.load_plugin(bl.artifact(*PLUGIN_FILES[variant]))
        info["plugin"] = f"{plugin.name} {plugin.version}"

        def calls_now():
            for e in max_device.list_ops():
                if e["op"] == "aten::add.out" and not e.get("via"):
                    return e["layers"][-1]["calls"]
            raise RuntimeError("aten::add.out is not served by a plugin")
    elif variant == "native":
        assert not max_device.list_plugins(), "native must run without plugins"
        path = bl.artifact("bench", "libbench_native_add.so")
        torch.ops.load_library(path)
        counter = ctypes.CDLL(path).bench_native_add_calls
        counter.restype = ctypes.c_int64
        calls_now = counter
        info["library"] = path
    elif variant in ("python", "python_noop"):
        assert not max_device.list_plugins()
        count = [0]
        if variant == "python":
            def add_out(self, other, *, alpha=1, out):
                count[0] += 1
                torch.add(_host_view(self), _host_view(other), alpha=alpha, out=_host_view(out))
                return out
        else:
            def add_out(self, other, *, alpha=1, out):
                count[0] += 1
                return out
        # The renamed PrivateUse1 key; torch.library maps the device name to it.
        torch.library.impl("aten::add.out", dev)(add_out)
        info["registration"] = f'torch.library.impl("aten::add.out", "{dev}")'
        calls_now = lambda: count[0]  # noqa: E731
    elif variant == "fallback":
        assert not max_device.list_plugins()
        # a direct fallback: the CPU kernel of the form called, aten::add.Tensor
        calls_now = lambda: max_device.fallback_counts().get("aten::add.Tensor", 0)  # noqa: E731
    elif variant != "cpu":
        raise SystemExit(f"unknown variant {variant}")
    return info, calls_now


def check_no_fallback(variant):
    import max_device

    fallbacks = max_device.fallback_counts()
    if variant not in ("cpu", "fallback") and (fallbacks.get("aten::add.out") or fallbacks.get("aten::add.Tensor")):
        raise RuntimeError(f"{variant}: the CPU fallback ran: {fallbacks}")


def worker(variant: str, blocks: int, calls: int, warmup: int) -> dict:
    global torch
    import torch
    import max_device

    dev = max_device.DEVICE_NAME
    g = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(NUMEL, generator=g), torch.randn(NUMEL, generator=g)
    want = a_cpu + b_cpu
    info, calls_now = setup(variant)

    if variant == "cpu":
        a, b = a_cpu, b_cpu
    else:
        a, b = a_cpu.to(dev), b_cpu.to(dev)
    add = torch.add
    before = calls_now() if calls_now else 0
    max_device.reset_fallback_counts()
    got = add(a, b)
    if variant != "python_noop":
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert got.device.type == a.device.type
    del got

    for _ in range(warmup):
        add(a, b)
    samples = []
    gc.collect()
    gc.disable()
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            add(a, b)
        t1 = time.perf_counter_ns()
        samples.append((t1 - t0) / calls)
    gc.enable()

    verify_calls(variant, info, calls_now, before, 1 + warmup + blocks * calls)
    info.update({"torch_threads": torch.get_num_threads(), "per_call_ns": samples})
    return info


def verify_calls(variant, info, calls_now, before, expected):
    """The kernel under test ran exactly `expected` times, and no call fell back."""
    if calls_now is not None:
        ran = calls_now() - before
        if ran != expected:
            raise RuntimeError(f"{variant}: the kernel under test ran {ran} times, expected {expected}")
        info["kernel_calls_verified"] = ran
    check_no_fallback(variant)


def sweep_worker(variant: str, blocks: int, block_ns: int) -> dict:
    """Every size of SWEEP_SIZES for one variant: per-call samples per size."""
    global torch
    import torch
    import max_device

    dev = "cpu" if variant == "cpu" else max_device.DEVICE_NAME
    info, calls_now = setup(variant)
    max_device.reset_fallback_counts()
    before = calls_now() if calls_now else 0
    made = 0  # add calls made here, to prove the kernel under test ran each
    add = torch.add
    sizes = {}
    g = torch.Generator().manual_seed(0)
    for n in SWEEP_SIZES:
        a_cpu, b_cpu = torch.randn(n, generator=g), torch.randn(n, generator=g)
        a, b = a_cpu.to(dev), b_cpu.to(dev)
        torch.testing.assert_close(add(a, b).cpu(), a_cpu + b_cpu, rtol=0, atol=0)
        slowest = 0  # of three calls: a conservative calls-per-block on a loaded machine
        for _ in range(3):
            t0 = time.perf_counter_ns()
            add(a, b)
            slowest = max(slowest, time.perf_counter_ns() - t0)
        calls = max(1, min(10_000, block_ns // slowest))
        for _ in range(calls):  # warm-up: one block
            add(a, b)
        made += 4 + calls
        samples = []
        gc.collect()
        gc.disable()
        for _ in range(blocks):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                add(a, b)
            samples.append((time.perf_counter_ns() - t0) / calls)
        gc.enable()
        made += blocks * calls
        sizes[str(n)] = {"calls_per_block": calls, "per_call_ns": samples}
        del a, b, a_cpu, b_cpu
    verify_calls(variant, info, calls_now, before, made)
    info.update({"torch_threads": torch.get_num_threads(), "sizes": sizes})
    return info


# ---------------------------------------------------------------------------
# Parent: rounds of workers, then the table
# ---------------------------------------------------------------------------

def run_python_variants(rounds, blocks, calls, warmup):
    per_variant = {v: {"per_call_ns": [], "round_medians_ns": []} for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for v in order:
            res = bl.run_json([sys.executable, os.path.abspath(__file__), "--worker", v,
                               "--blocks", str(blocks), "--calls", str(calls),
                               "--warmup", str(warmup)])
            d = per_variant[v]
            d["per_call_ns"] += res.pop("per_call_ns")
            d["round_medians_ns"].append(bl.summarize(d["per_call_ns"][-blocks:])["median"])
            d["info"] = res
            print(f"  round {r + 1}/{rounds} {v:12s} {d['round_medians_ns'][-1]:9.0f} ns/call",
                  flush=True)
    for d in per_variant.values():
        d["stats_ns"] = bl.summarize(d["per_call_ns"])
    return per_variant


def cpp_modes():
    """bench_call_path and, per mode of CPP_MODES, its arguments (mode,
    library); None when it was not built."""
    exe = bl.artifact("bench", "bench_call_path", required=False)
    if exe is None:
        return None
    args = {"plugin": ("plugin", bl.artifact(*PLUGIN_FILES["plugin"])),
            "same_loop": ("plugin", bl.artifact(*PLUGIN_FILES["same_loop"])),
            "native": ("native", bl.artifact("bench", "libbench_native_add.so")),
            "kernel": ("kernel", bl.artifact(*PLUGIN_FILES["plugin"]))}
    return exe, {m: args.get(m, (m,)) for m in CPP_MODES}


def run_cpp(exe, mode_args, blocks, calls, warmup):
    """One bench_call_path process: its JSON (per-call ns of each block)."""
    return bl.run_json([exe, *mode_args, "--numel", str(NUMEL), "--blocks", str(blocks),
                        "--calls", str(calls), "--warmup", str(warmup)])


def run_cpp_modes(rounds, blocks, calls, warmup):
    found = cpp_modes()
    if found is None:
        print("  (bench_call_path not built: skipping the C++ figures)")
        return None
    exe, commands = found
    per_mode = {m: {"per_call_ns": [], "round_medians_ns": []} for m in CPP_MODES}
    for r in range(rounds):
        order = CPP_MODES[r % len(CPP_MODES):] + CPP_MODES[:r % len(CPP_MODES)]
        for m in order:
            res = run_cpp(exe, commands[m], blocks, calls, warmup)
            d = per_mode[m]
            d["per_call_ns"] += res["per_call_ns"]
            d["round_medians_ns"].append(bl.summarize(res["per_call_ns"])["median"])
            if res.get("note"):
                d["note"] = res["note"]
    for d in per_mode.values():
        d["stats_ns"] = bl.summarize(d["per_call_ns"])
    return per_mode


def run_cpp_pairs(pairs, blocks, calls, warmup):
    """The C++ call-path target, read on paired runs: native and same-loop
    back to back (order alternating) in many short processes, one difference
    of their medians per pair, so that the machine's drift between processes
    (this VM's clock moves by a third within seconds) falls out of each pair."""
    found = cpp_modes()
    if found is None:
        return None
    exe, commands = found
    diffs, ratios = [], []
    for r in range(pairs):
        med = {}
        for m in (("native", "same_loop") if r % 2 == 0 else ("same_loop", "native")):
            med[m] = bl.summarize(run_cpp(exe, commands[m], blocks, calls, warmup)["per_call_ns"])["median"]
        diffs.append(med["same_loop"] - med["native"])
        ratios.append(med["same_loop"] / med["native"])
    return {"pairs": pairs, "minus_native_ns": diffs, "over_native": ratios,
            "minus_native_stats_ns": bl.summarize(diffs), "over_native_stats": bl.summarize(ratios)}


def run_sweep(blocks, block_ns):
    per_variant = {}
    for v in SWEEP_VARIANTS:
        res = bl.run_json([sys.executable, os.path.abspath(__file__), "--sweep-worker", v,
                           "--blocks", str(blocks), "--block-ns", str(block_ns)])
        for d in res["sizes"].values():
            d["stats_ns"] = bl.summarize(d["per_call_ns"])
        per_variant[v] = res
        print(f"  sweep {v:9s} done", flush=True)
    return {"sizes": list(SWEEP_SIZES), "blocks_per_size": blocks, "block_ns": block_ns,
            "variants": per_variant}


def sweep_median(sweep, variant, n):
    return sweep["variants"][variant]["sizes"][str(n)]["stats_ns"]["median"]


def size_label(n):
    return f"2^{n.bit_length() - 1}" if n >= 1024 else str(n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repetitions")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sweep-worker", help=argparse.SUPPRESS)
    parser.add_argument("--block-ns", type=int)
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--no-cpp", action="store_true", help="skip the C++ figures")
    parser.add_argument("--out", default=os.path.join(bl.RESULTS_DIR, "plugin_call.json"))
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.blocks, args.calls, args.warmup)))
        return
    if args.sweep_worker:
        print(json.dumps(sweep_worker(args.sweep_worker, args.blocks, args.block_ns)))
        return

    rounds, blocks, calls, warmup = QUICK if args.quick else FULL
    machine = bl.machine()
    load_start = bl.loadavg()
    print(f"torch.add on {NUMEL} float32: {rounds} rounds x {blocks} blocks x {calls} calls "
          f"per variant", flush=True)
    py = run_python_variants(rounds, blocks, calls, warmup)
    cpp = None if args.no_cpp else run_cpp_modes(rounds, blocks, calls, warmup)
    pairs = None if args.no_cpp else run_cpp_pairs(PAIRS_QUICK if args.quick else PAIRS_FULL, 5, calls, warmup)
    print(f"per-op sweep: {len(SWEEP_SIZES)} sizes x {len(SWEEP_VARIANTS)} variants", flush=True)
    sweep = run_sweep(*(SWEEP_QUICK if args.quick else SWEEP_FULL))

    med = {v: py[v]["stats_ns"]["median"] for v in VARIANTS}
    ratios = {
        "same_loop_over_native": med["same_loop"] / med["native"],
        "same_loop_minus_native_ns": med["same_loop"] - med["native"],
        "plugin_over_native": med["plugin"] / med["native"],
        "python_over_plugin": med["python"] / med["plugin"],
        "python_noop_over_plugin": med["python_noop"] / med["plugin"],
        "plugin_over_cpu": med["plugin"] / med["cpu"],
        "native_over_cpu": med["native"] / med["cpu"],
        "plugin_minus_native_ns": med["plugin"] - med["native"],
    }
    cpp_ratios = None
    if cpp:
        cm = {m: cpp[m]["stats_ns"]["median"] for m in CPP_MODES}
        cpp_ratios = {"same_loop_over_native": cm["same_loop"] / cm["native"],
                      "same_loop_minus_native_ns": cm["same_loop"] - cm["native"],
                      "plugin_over_native": cm["plugin"] / cm["native"],
                      "plugin_minus_native_ns": cm["plugin"] - cm["native"],
                      "plugin_over_cpu": cm["plugin"] / cm["cpu"],
                      "kernel_direct_minus_loop_ns": cm["kernel"] - cm["loop"]}
    summary = [
        {"metric": "same-loop plugin / native (Python, torch.add 64 f32)",
         "value": ratios["same_loop_over_native"], "target": f"<= {TARGETS['same_loop_over_native_max']}",
         "ok": ratios["same_loop_over_native"] <= TARGETS["same_loop_over_native_max"]},
        {"metric": "reference plugin / native (Python, torch.add 64 f32)", "value": ratios["plugin_over_native"],
         "target": None, "ok": None},
        {"metric": "python-kernel / plugin", "value": ratios["python_over_plugin"], "target": None, "ok": None},
        {"metric": "plugin / cpu eager", "value": ratios["plugin_over_cpu"], "target": None, "ok": None},
    ]
    if pairs:
        pair_ns = pairs["minus_native_stats_ns"]["median"]
        summary.append({"metric": "same-loop plugin / native (C++ at::add, no Python; median of pairs)",
                        "value": pairs["over_native_stats"]["median"], "target": None, "ok": None})
        summary.append({"metric": "same-loop plugin - native (C++ at::add, ns; median of pairs)",
                        "value": pair_ns, "target": "<= 60", "ok": pair_ns <= 60})
    if cpp_ratios:
        summary.append({"metric": "reference plugin / native (C++ at::add, no Python)",
                        "value": cpp_ratios["plugin_over_native"], "target": None, "ok": None})
    for n in SWEEP_SUMMARY_SIZES:
        for num, den in (("plugin", "native"), ("fallback", "cpu"), ("python", "plugin")):
            summary.append({"metric": f"sweep n={size_label(n)}: {num} / {den}",
                            "value": sweep_median(sweep, num, n) / sweep_median(sweep, den, n),
                            "target": None, "ok": None})
    report = {"benchmark": "bench_plugin_call", "quick": args.quick, "numel": NUMEL,
              "dtype": "float32", "op": "torch.add(a, b) -> aten::add.Tensor -> aten::add.out",
              "machine": machine, "loadavg_start": load_start, "loadavg_end": bl.loadavg(),
              "config": {"rounds": rounds, "blocks_per_worker": blocks, "calls_per_block": calls,
                         "warmup_calls": warmup},
              "targets": TARGETS, "median_ns": med, "ratios": ratios,
              "python": py, "cpp": cpp, "cpp_ratios": cpp_ratios, "cpp_pairs": pairs, "sweep": sweep, "summary": summary}
    path = bl.write_json("plugin_call.json", report, args.out)

    bl.print_machine(machine, args.quick)
    header = (f"{'from Python: torch.add':24s} {'median us':>10s} {'p10 us':>8s} {'p90 us':>8s} "
              f"{'rounds min..max us':>19s} {'/ plugin':>9s}")
    bl.print_header(header)
    for v in VARIANTS:
        s, rm = py[v]["stats_ns"], py[v]["round_medians_ns"]
        print(f"{v:24s} {s['median'] / 1e3:>10.2f} {s['p10'] / 1e3:>8.2f} {s['p90'] / 1e3:>8.2f} "
              f"{min(rm) / 1e3:>9.2f}..{max(rm) / 1e3:<9.2f} {s['median'] / med['plugin']:>9.2f}")
    if cpp:
        print()
        header = f"{'from C++ (no Python)':24s} {'median ns':>10s} {'p10 ns':>8s} {'p90 ns':>8s}"
        bl.print_header(header)
        names = {"plugin": "at::add, plugin", "same_loop": "at::add, same-loop plugin",
                 "native": "at::add, native kernel",
                 "cpu": "at::add, CPU", "kernel": "plugin kernel direct",
                 "loop": "float loop alone"}
        for m in CPP_MODES:
            s = cpp[m]["stats_ns"]
            print(f"{names[m]:24s} {s['median']:>10.0f} {s['p10']:>8.0f} {s['p90']:>8.0f}")
    print()
    print(f"same-loop / native   {ratios['same_loop_over_native']:.3f}  (target <= "
          f"{TARGETS['same_loop_over_native_max']}; +{ratios['same_loop_minus_native_ns']:.0f} ns/call)")
    print(f"reference / native   {ratios['plugin_over_native']:.3f}  (+{ratios['plugin_minus_native_ns']:.0f} ns/call)")
    print(f"python / plugin      {ratios['python_over_plugin']:.2f}   (empty Python kernel: "
          f"{ratios['python_noop_over_plugin']:.2f})")
    print(f"plugin / cpu eager   {ratios['plugin_over_cpu']:.2f}   (native / cpu "
          f"{ratios['native_over_cpu']:.2f})")
    if cpp_ratios:
        print(f"C++: same-loop / native {cpp_ratios['same_loop_over_native']:.3f} "
              f"(+{cpp_ratios['same_loop_minus_native_ns']:.0f} ns, medians of all blocks); reference / native "
              f"{cpp_ratios['plugin_over_native']:.3f} "
              f"(+{cpp_ratios['plugin_minus_native_ns']:.0f} ns); plugin kernel body vs bare loop "
              f"+{cpp_ratios['kernel_direct_minus_loop_ns']:.0f} ns")
    if pairs:
        d = pairs["minus_native_stats_ns"]
        print(f"C++: same-loop - native, median of {pairs['pairs']} paired runs: {d['median']:+.0f} ns "
              f"(p10 {d['p10']:+.0f}, p90 {d['p90']:+.0f}; target <= +60 ns), ratio "
              f"{pairs['over_native_stats']['median']:.3f}")
    print()
    header = f"{'sweep: elements':16s}" + "".join(f"{v + ' us':>12s}" for v in SWEEP_VARIANTS) + \
        f"{'plug/nat':>9s}{'fb/cpu':>8s}"
    bl.print_header(header)
    for n in SWEEP_SIZES:
        med_n = {v: sweep_median(sweep, v, n) for v in SWEEP_VARIANTS}
        print(f"{size_label(n):16s}" + "".join(f"{med_n[v] / 1e3:>12.2f}" for v in SWEEP_VARIANTS) +
              f"{med_n['plugin'] / med_n['native']:>9.2f}{med_n['fallback'] / med_n['cpu']:>8.2f}")
    print(f"\nraw samples: {path}")


if __name__ == "__main__":
    main()
