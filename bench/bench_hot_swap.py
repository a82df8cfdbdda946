"""Hot-swap costs, measured by the C++ binary <build>/bench/bench_hot_swap
(bench/bench_hot_swap.cpp; one mode per process):

  (1) readpath  the trampoline's read path (ReadGuard + OpTable::current() +
                the op's provider stack) in a tight loop on 1 and 2 threads
                at once, over a plain function call; beside an acquire load
                of a pointer and a copy of a shared std::shared_ptr. Headline:
                thread CPU time per iteration (robust to the process being
                descheduled on a shared machine); wall time is kept too.
  (2) reload    PluginRegistry::reload alternating between two builds of the
                generated 100-op plugin bench100 (1.0.0 <-> 2.0.0); the publish
                step alone (OpTable::publish of a copy of the current table:
                pointer swap + grace period), idle and with a thread calling
                an op meanwhile; push_override/remove_override.
  (3) latency   per-call latency of 1 and 2 threads calling a plugin op while
                the main thread (a) waits, (b) reloads between the two builds
                continuously, (c) spins (CPU contention without swaps):
                bench100::k0 on 64 float32 (reloading bench100), and at::add
                on 64 float32 (reloading reference <-> reference_v2). Every
                result is checked; a wrong or failed call fails the run.

The parent runs the modes in several rounds, rotating their order, and
reports medians over all repetitions.

    PYTHONPATH=python .venv/bin/python bench/bench_hot_swap.py [--quick]

Writes bench/results/hot_swap.json (raw samples, machine).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

TARGETS = {"read_path_over_call_ns_max": 5.0, "reload_100_ms_max": 20.0, "publish_ms_max": 1.0}
# (rounds, readpath reps, readpath iters, reloads, publishes, latency rounds,
#  calls per thread for k0, for add)
FULL = (3, 7, 20_000_000, 60, 200, 2, 1_000_000, 300_000)
QUICK = (1, 5, 5_000_000, 50, 100, 1, 200_000, 60_000)
VARIANTS = ("empty_loop", "direct_call", "atomic_acquire_load", "shared_ptr_copy", "read_path")
CONDITIONS = ("idle", "reload", "spin")


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(bl.RESULTS_DIR, "hot_swap.json"))
    args = parser.parse_args()
    rounds, reps, iters, reloads, publishes, lat_rounds, calls_k0, calls_add = QUICK if args.quick else FULL

    exe = bl.artifact("bench", "bench_hot_swap")
    v1 = bl.artifact("bench", "libbench_plugin_100_v1.so")
    v2 = bl.artifact("bench", "libbench_plugin_100_v2.so")
    ref1 = bl.artifact("plugins", "libreference.so")
    ref2 = bl.artifact("plugins", "libreference_v2.so")
    machine = bl.machine()
    load_start = bl.loadavg()

    jobs = {
        "readpath": [exe, "readpath", v1, "--threads", "1,2", "--reps", str(reps), "--iters", str(iters)],
        "reload": [exe, "reload", v1, v2, "--reloads", str(reloads), "--publishes", str(publishes)],
        "latency_k0": [exe, "latency", v1, v2, "--op", "k0", "--threads", "1,2", "--calls", str(calls_k0),
                       "--rounds", str(lat_rounds)],
        "latency_add": [exe, "latency", ref1, ref2, "--op", "add", "--threads", "1,2", "--calls",
                        str(calls_add), "--rounds", str(lat_rounds)],
    }
    raw = {k: [] for k in jobs}
    names = list(jobs)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            res = bl.run_json(jobs[name], timeout=900)
            res["loadavg"] = bl.loadavg()
            raw[name].append(res)
            print(f"  round {r + 1}/{rounds}: {name} done (load avg {res['loadavg'][0]:.2f})", flush=True)

    # (1) read path: samples per (variant, threads), one per thread per rep per process.
    readpath = {}
    for res in raw["readpath"]:
        for e in res["results"]:
            d = readpath.setdefault(f"{e['variant']}/{e['threads']}", {"cpu_ns": [], "wall_ns": []})
            d["cpu_ns"] += e["cpu_ns"]
            d["wall_ns"] += e["wall_ns"]
    threads = sorted({int(k.split("/")[1]) for k in readpath})
    for d in readpath.values():
        d["cpu_stats"] = bl.summarize(d["cpu_ns"])
        d["wall_stats"] = bl.summarize(d["wall_ns"])

    def rp(variant, t, clock="cpu"):
        return readpath[f"{variant}/{t}"][f"{clock}_stats"]["median"]

    # (2) reload and publish
    rl = {}
    for key in ("reload_ns", "reload_loader_reported_ns", "copy_current_ns", "publish_ns",
                "publish_busy_reader_ns", "push_override_ns", "remove_override_ns"):
        samples = [x for res in raw["reload"] for x in res[key]]
        rl[key] = bl.summarize(samples)
        rl[key]["p99"] = pct(samples, 0.99)
        rl[key]["max"] = max(samples)

    # (3) latency: per phase percentiles; the median over phases of each.
    latency = {}
    for job in ("latency_k0", "latency_add"):
        for res in raw[job]:
            for ph in res["phases"]:
                d = latency.setdefault(f"{job[len('latency_'):]}/{ph['threads']}/{ph['condition']}",
                                       {"op": res["op"], "phases": []})
                d["phases"].append(ph)
    for d in latency.values():
        ph = d["phases"]
        for k in ("p50_ns", "p99_ns", "p999_ns", "mean_ns"):
            d[k] = statistics.median(p[k] for p in ph)
        d["max_ns"] = max(p["max_ns"] for p in ph)
        d["max_ns_median"] = statistics.median(p["max_ns"] for p in ph)
        d["reloads"] = sum(p["reloads"] for p in ph)
        d["calls"] = sum(p["calls"] for p in ph)
        rs = [x for p in ph for x in p["reload_ns"]]
        d["reload_ms_median"] = statistics.median(rs) / 1e6 if rs else None

    summary = []
    for t in threads:
        over = rp("read_path", t) - rp("direct_call", t)
        summary.append({"metric": f"read path over a call, {t} thread{'s' if t > 1 else ''} (ns, cpu)",
                        "value": over, "target": f"<= {TARGETS['read_path_over_call_ns_max']:.0f}",
                        "ok": over <= TARGETS["read_path_over_call_ns_max"]})
    reload_ms = rl["reload_ns"]["median"] / 1e6
    publish_ms = rl["publish_ns"]["median"] / 1e6
    summary += [
        {"metric": "reload, 100-op plugin (ms)", "value": reload_ms,
         "target": f"<= {TARGETS['reload_100_ms_max']:.0f}", "ok": reload_ms <= TARGETS["reload_100_ms_max"]},
        {"metric": "publish alone, idle (ms)", "value": publish_ms,
         "target": f"<= {TARGETS['publish_ms_max']:.0f}", "ok": publish_ms <= TARGETS["publish_ms_max"]},
        {"metric": "publish alone, 1 thread calling (ms)", "value": rl["publish_busy_reader_ns"]["median"] / 1e6,
         "target": f"<= {TARGETS['publish_ms_max']:.0f}",
         "ok": rl["publish_busy_reader_ns"]["median"] / 1e6 <= TARGETS["publish_ms_max"]},
    ]
    for t in threads:
        idle, swap = latency[f"k0/{t}/idle"], latency[f"k0/{t}/reload"]
        summary.append({"metric": f"k0 call p99, {t} thr, reloading / idle", "value": swap["p99_ns"] / idle["p99_ns"],
                        "target": None, "ok": None})

    report = {"benchmark": "bench_hot_swap", "quick": args.quick, "machine": machine,
              "loadavg_start": load_start, "loadavg_end": bl.loadavg(),
              "config": {"rounds": rounds, "readpath_reps": reps, "readpath_iters": iters, "reloads": reloads,
                         "publishes": publishes, "latency_rounds": lat_rounds, "calls_per_thread_k0": calls_k0,
                         "calls_per_thread_add": calls_add, "commands": jobs},
              "targets": TARGETS, "readpath": readpath, "reload": rl, "latency": latency,
              "summary": summary, "raw": raw}
    path = bl.write_json("hot_swap.json", report, args.out)

    bl.print_machine(machine, args.quick)
    print(f"\n(1) read path, ns per iteration (median; cpu = thread CPU time, wall in brackets); "
          f"'over call' subtracts direct_call")
    header = "variant".ljust(22) + "".join(f"{f'{t} thr cpu':>12s}{'(wall)':>9s}{'over call':>11s}" for t in threads)
    bl.print_header(header)
    for v in VARIANTS:
        line = v.ljust(22)
        for t in threads:
            line += f"{rp(v, t):>12.2f}{'(%.2f)' % rp(v, t, 'wall'):>9s}{rp(v, t) - rp('direct_call', t):>11.2f}"
        print(line)

    print(f"\n(2) reload and publish, 100-op plugin (median, p10..p90, p99, max; ms)")
    labels = {"reload_ns": "reload (1.0.0 <-> 2.0.0)", "reload_loader_reported_ns": "  (loader-reported)",
              "copy_current_ns": "copy_current", "publish_ns": "publish, idle",
              "publish_busy_reader_ns": "publish, 1 thread calling", "push_override_ns": "push_override",
              "remove_override_ns": "remove_override"}
    print(f"{'step':28s} {'median':>9s} {'p10..p90':>19s} {'p99':>8s} {'max':>8s} {'n':>5s}")
    for key, label in labels.items():
        s = rl[key]
        print(f"{label:28s} {s['median'] / 1e6:>9.4f} {s['p10'] / 1e6:>9.4f}..{s['p90'] / 1e6:<8.4f} "
              f"{s['p99'] / 1e6:>8.3f} {s['max'] / 1e6:>8.3f} {s['n']:>5d}")

    print(f"\n(3) call latency, ns (median over phases of each phase's percentile; max over all phases)")
    print(f"{'op':16s} {'thr':>3s} {'main thread':12s} {'p50':>7s} {'p99':>7s} {'p99.9':>8s} {'max':>10s} "
          f"{'calls':>9s} {'reloads':>8s}")
    for key, d in latency.items():
        op, t, cond = key.split("/")
        print(f"{d['op']:16s} {t:>3s} {cond:12s} {d['p50_ns']:>7.0f} {d['p99_ns']:>7.0f} {d['p999_ns']:>8.0f} "
              f"{d['max_ns']:>10.0f} {d['calls']:>9d} {d['reloads']:>8d}")
    print("main thread: idle = waits; reload = reloads the plugin between its two builds nonstop; "
          "spin = busy loop (CPU contention, no swaps)")
    print("every call's result was checked; no wrong or failed call")

    print()
    for s in summary:
        ok = "" if s["ok"] is None else ("  ok" if s["ok"] else "  MISSED")
        print(f"{s['metric']}: {s['value']:.3f}" + (f" (target {s['target']}){ok}" if s["target"] else ""))
    print(f"\nraw samples: {path}")


if __name__ == "__main__":
    main()
