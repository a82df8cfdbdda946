"""The CPU fallback from Python: an op on max_device tensors against the same
op on CPU tensors, for the zero-copy fallback and PyTorch's copying
at::native::cpu_fallback, measured interleaved in one run.

    PYTHONPATH=python .venv/bin/python bench/bench_fallback.py [--quick]

Writes the raw samples and medians to bench/results/fallback.json and prints
a table of ratios (device median / CPU median; 1.0 = no overhead).
"""

import argparse
import json
import os
import statistics
import time

import torch

import max_device
import _benchlib as bl

DEVICE = "max_device"
SIZES = (64, 1 << 20, 1 << 24)
# Repetitions per size (full, quick): each repetition times every variant once.
REPS = {64: (3000, 600), 1 << 20: (300, 60), 1 << 24: (30, 8)}
WARMUP = {64: 200, 1 << 20: 20, 1 << 24: 3}

OPS = {
    # structured: a direct fallback runs the CPU's aten::add.Tensor (without
    # it, PyTorch's composite would allocate on the device and call add.out)
    "add": (lambda a, b: torch.add(a, b), "aten::add.Tensor"),
    # not structured: the fallback runs aten::relu and adopts the CPU output
    "relu": (lambda a, b: torch.relu(a), "aten::relu"),
}


def time_once(fn, a, b):
    t0 = time.perf_counter_ns()
    out = fn(a, b)
    t1 = time.perf_counter_ns()
    del out
    return t1 - t0


def bench_op(name, fn, expected_fallback, n, reps, warmup):
    g = torch.Generator().manual_seed(0)
    a_cpu = torch.randn(n, generator=g)
    b_cpu = torch.randn(n, generator=g)
    a_dev, b_dev = a_cpu.to(DEVICE), b_cpu.to(DEVICE)

    def set_impl(impl):
        max_device._C._set_fallback_impl(impl)

    variants = {
        "cpu": lambda: time_once(fn, a_cpu, b_cpu),
        "zero_copy": lambda: (set_impl("zero_copy"), time_once(fn, a_dev, b_dev))[1],
        "copying": lambda: (set_impl("copying"), time_once(fn, a_dev, b_dev))[1],
    }
    # correctness and the path taken, before timing
    set_impl("zero_copy")
    max_device.reset_fallback_counts()
    torch.testing.assert_close(fn(a_dev, b_dev).cpu(), fn(a_cpu, b_cpu), rtol=0, atol=0)
    counts = max_device.fallback_counts()
    assert counts.get(expected_fallback, 0) == 1, f"{name} did not take the fallback: {counts}"

    for _ in range(warmup):
        for v in variants.values():
            v()
    samples = {k: [] for k in variants}
    order = list(variants)
    for i in range(reps):
        # rotate the order so no variant always runs right after another
        rot = order[i % len(order):] + order[:i % len(order)]
        for k in rot:
            samples[k].append(variants[k]())
    set_impl("zero_copy")
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "op": name, "fallback_op": expected_fallback, "numel": n, "dtype": "float32", "reps": reps,
        "median_ns": med,
        "ratio_zero_copy": med["zero_copy"] / med["cpu"],
        "ratio_copying": med["copying"] / med["cpu"],
        "samples_ns": samples,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results", "fallback.json"))
    args = parser.parse_args()

    results = []
    for name, (fn, fallback_op) in OPS.items():
        for n in SIZES:
            reps = REPS[n][1 if args.quick else 0]
            results.append(bench_op(name, fn, fallback_op, n, reps, WARMUP[n]))
            r = results[-1]
            print(f"  {name:5s} n={n:>9d}: zero_copy {r['ratio_zero_copy']:.3f}x  "
                  f"copying {r['ratio_copying']:.3f}x", flush=True)

    report = {"benchmark": "bench_fallback", "quick": args.quick, "machine": bl.machine(),
              "targets": {"zero_copy_ratio_max": {"64": 1.3, "1048576": 1.05, "16777216": 1.05}},
              "results": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    bl.print_machine(report["machine"], args.quick)
    header = f"{'op':6s} {'fallback op':15s} {'numel':>9s} {'reps':>5s} {'cpu us':>10s} " \
             f"{'zero-copy us':>13s} {'ratio':>6s} {'copying us':>11s} {'ratio':>6s}"
    bl.print_header(header)
    for r in results:
        med = r["median_ns"]
        print(f"{r['op']:6s} {r['fallback_op']:15s} {r['numel']:>9d} {r['reps']:>5d} "
              f"{med['cpu'] / 1e3:>10.1f} {med['zero_copy'] / 1e3:>13.1f} {r['ratio_zero_copy']:>6.3f} "
              f"{med['copying'] / 1e3:>11.1f} {r['ratio_copying']:>6.3f}")
    print(f"\nraw samples: {args.out}")


if __name__ == "__main__":
    main()
