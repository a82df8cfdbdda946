"""Plugin load, unload and inspect times:

  (a) max_device.load_plugin + unload_plugin of a generated plugin with
      1,000 custom ops (bench1k::k0 ... k999, target bench_plugin_1000), and
      of the reference plugin (22 kernels) for scale: one warmup cycle, then
      the median of many cycles in one process, alternating the two;
  (b) max_device.inspect() (the manifest, read without loading) on both files,
      median of many calls.

    PYTHONPATH=python .venv/bin/python bench/bench_load.py [--quick]

Writes bench/results/load.json (raw samples, machine).
"""

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

TARGETS = {"load_1000_ms_max": 100.0, "inspect_ms_max": 10.0}
# (load/unload cycles, inspect calls)
FULL = (20, 200)
QUICK = (8, 50)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(bl.RESULTS_DIR, "load.json"))
    args = parser.parse_args()
    cycles, inspects = QUICK if args.quick else FULL

    import torch
    import max_device

    max_device.set_log_level("warn")  # one info line per load would drown the output
    plugins = {
        "bench1k (1000 ops)": bl.artifact("bench", "libbench_plugin_1000.so"),
        "reference (22 ops)": bl.artifact("plugins", "libreference.so"),
    }
    machine = bl.machine()
    load_start = bl.loadavg()

    def cycle(path):
        t0 = time.perf_counter_ns()
        p = max_device.load_plugin(path)
        t1 = time.perf_counter_ns()
        report = max_device.unload_plugin(p)
        t2 = time.perf_counter_ns()
        return p, report, t1 - t0, t2 - t1

    results = {}
    # Warmup cycle, which also checks that the plugin really serves its ops.
    for label, path in plugins.items():
        p, report, load_ns, unload_ns = cycle(path)
        results[label] = {"path": path, "ops": len(p.ops), "first_load_ns": load_ns,
                          "first_unload_ns": unload_ns, "unmapped": report["unmapped"],
                          "load_ns": [], "unload_ns": [], "loader_reported_load_ns": [],
                          "inspect_ns": []}
    assert results["bench1k (1000 ops)"]["ops"] == 1000, results["bench1k (1000 ops)"]["ops"]
    p = max_device.load_plugin(plugins["bench1k (1000 ops)"])
    x = torch.randn(16)
    y = torch.ops.bench1k.k999(x.to(max_device.DEVICE_NAME))
    torch.testing.assert_close(y.cpu(), x, rtol=0, atol=0)
    calls = next(e for e in max_device.list_ops() if e["op"] == "bench1k::k999")["layers"][-1]["calls"]
    assert calls == 1, calls
    max_device.unload_plugin(p)

    gc.collect()
    for i in range(cycles):
        labels = list(plugins) if i % 2 == 0 else list(reversed(plugins))
        for label in labels:
            p, report, load_ns, unload_ns = cycle(plugins[label])
            r = results[label]
            r["load_ns"].append(load_ns)
            r["unload_ns"].append(unload_ns)
            r["loader_reported_load_ns"].append(int(p.load_seconds * 1e9))
            r["unmapped"] = r["unmapped"] and report["unmapped"]
        print(f"  cycle {i + 1}/{cycles}: " + ", ".join(
            f"{label.split()[0]} load {results[label]['load_ns'][-1] / 1e6:.1f} ms "
            f"unload {results[label]['unload_ns'][-1] / 1e6:.1f} ms" for label in plugins), flush=True)

    for label, path in plugins.items():
        max_device.inspect(path)  # warmup
    for i in range(inspects):
        for label, path in plugins.items():
            t0 = time.perf_counter_ns()
            m = max_device.inspect(path)
            t1 = time.perf_counter_ns()
            results[label]["inspect_ns"].append(t1 - t0)
    assert len(max_device.inspect(plugins["bench1k (1000 ops)"]).kernels) == 1000

    for r in results.values():
        for k in ("load_ns", "unload_ns", "loader_reported_load_ns", "inspect_ns"):
            r[k + "_stats"] = bl.summarize(r[k])

    big = results["bench1k (1000 ops)"]
    load_ms = big["load_ns_stats"]["median"] / 1e6
    inspect_ms = max(r["inspect_ns_stats"]["median"] for r in results.values()) / 1e6
    summary = [
        {"metric": "load_plugin, 1000 ops (ms)", "value": load_ms,
         "target": f"<= {TARGETS['load_1000_ms_max']:.0f}", "ok": load_ms <= TARGETS["load_1000_ms_max"]},
        {"metric": "unload_plugin, 1000 ops (ms)", "value": big["unload_ns_stats"]["median"] / 1e6,
         "target": None, "ok": None},
        {"metric": "inspect, slowest of the two files (ms)", "value": inspect_ms,
         "target": f"<= {TARGETS['inspect_ms_max']:.0f}", "ok": inspect_ms <= TARGETS["inspect_ms_max"]},
    ]
    report = {"benchmark": "bench_load", "quick": args.quick, "machine": machine,
              "loadavg_start": load_start, "loadavg_end": bl.loadavg(),
              "config": {"cycles": cycles, "inspect_calls": inspects}, "targets": TARGETS,
              "results": results, "summary": summary}
    path = bl.write_json("load.json", report, args.out)

    bl.print_machine(machine, args.quick)
    header = (f"{'plugin':20s} {'ops':>5s} {'first load':>11s} {'load ms':>8s} {'p10..p90':>13s} "
              f"{'(loader)':>9s} {'unload ms':>10s} {'inspect ms':>11s} {'p10..p90':>13s}")
    bl.print_header(header)
    for label, r in results.items():
        ls, us, ins = r["load_ns_stats"], r["unload_ns_stats"], r["inspect_ns_stats"]
        print(f"{label:20s} {r['ops']:>5d} {r['first_load_ns'] / 1e6:>11.1f} {ls['median'] / 1e6:>8.2f} "
              f"{ls['p10'] / 1e6:>6.2f}..{ls['p90'] / 1e6:<6.2f} "
              f"{r['loader_reported_load_ns_stats']['median'] / 1e6:>9.2f} {us['median'] / 1e6:>10.2f} "
              f"{ins['median'] / 1e6:>11.3f} {ins['p10'] / 1e6:>6.3f}..{ins['p90'] / 1e6:<6.3f}")
    print(f"\nload 1000 ops: {load_ms:.1f} ms (target <= {TARGETS['load_1000_ms_max']:.0f}); "
          f"inspect: {inspect_ms:.2f} ms (target <= {TARGETS['inspect_ms_max']:.0f}); "
          f"unmapped after unload: {all(r['unmapped'] for r in results.values())}")
    print(f"(loader) = load_duration_ns the loader reports itself, without Python")
    print(f"\nraw samples: {path}")


if __name__ == "__main__":
    main()
