"""Runs every bench/bench_*.py (each in its own process, --quick passed
through), prints their tables as they come, then one combined summary of
the headline figures and their targets. `make bench` runs this.

Besides each benchmark's raw JSON it writes, in bench/results/:
summary.md (the summary as a Markdown table, each figure marked against its
target) and PNG plots of the figures the README shows (plots.py).

    .venv/bin/python bench/run_all.py [--quick] [--only NAME ...]

The package is imported from python/ and the build from $MAXDEV_BUILD_DIR
(default: build/); both are set for the benchmarks it starts.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402
import plots  # noqa: E402

# Result file of each benchmark (its summary rows feed the combined table).
RESULT_FILES = {"bench_fallback": "fallback.json", "bench_plugin_call": "plugin_call.json",
                "bench_load": "load.json", "bench_preflight": "preflight.json"}


def summary_rows(name, report):
    """Headline rows of one result file: (metric, value, target, ok)."""
    if "summary" in report:
        return [(r["metric"], r["value"], r.get("target"), r.get("ok")) for r in report["summary"]]
    if name == "bench_fallback":  # its JSON has no summary list: derive one
        rows = []
        targets = report.get("targets", {}).get("zero_copy_ratio_max", {})
        for r in report.get("results", []):
            t = targets.get(str(r["numel"]))
            v = r["ratio_zero_copy"]
            rows.append((f"fallback zero-copy / cpu, {r['op']} n={r['numel']}", v,
                         f"<= {t}" if t is not None else None, None if t is None else v <= t))
        return rows
    return []


def write_markdown(rows, machine, quick, failed):
    """bench/results/summary.md: every headline figure against its target."""
    lines = ["# Benchmark summary", ""]
    if machine:
        lines += [bl.machine_line(machine) + (" (quick)" if quick else ""), ""]
    lines += ["| benchmark | metric | value | target | met |", "|---|---|---:|---|---|"]
    for bench, metric, value, target, ok in rows:
        mark = "" if ok is None else ("yes" if ok else "**no**")
        lines.append(f"| {bench} | {metric} | {value:.3f} | {target or ''} | {mark} |")
    if failed:
        lines += ["", f"Failed to run: {', '.join(failed)}"]
    path = os.path.join(bl.RESULTS_DIR, "summary.md")
    os.makedirs(bl.RESULTS_DIR, exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions in every benchmark")
    parser.add_argument("--only", nargs="*", help="benchmark names (bench_load, load, ...)")
    args = parser.parse_args()

    scripts = sorted(glob.glob(os.path.join(bl.BENCH_DIR, "bench_*.py")))
    if args.only:
        wanted = {n if n.startswith("bench_") else "bench_" + n for n in args.only}
        scripts = [s for s in scripts if os.path.splitext(os.path.basename(s))[0] in wanted]
    failed, ran = [], []
    t_all = time.monotonic()
    for script in scripts:
        name = os.path.splitext(os.path.basename(script))[0]
        print(f"\n=== {name}{' --quick' if args.quick else ''} ===", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, script] + (["--quick"] if args.quick else []),
                             env=bl.child_env())
        print(f"--- {name}: exit {rc}, {time.monotonic() - t0:.0f} s", flush=True)
        (failed if rc != 0 else ran).append(name)

    print("\n=== summary ===")
    machine = None
    rows = []
    for name in ran:
        path = os.path.join(bl.RESULTS_DIR, RESULT_FILES.get(name, name[len("bench_"):] + ".json"))
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{name}: no readable result ({e})")
            continue
        machine = machine or report.get("machine")
        rows += [(name,) + r for r in summary_rows(name, report)]
    if machine:
        print(bl.machine_line(machine) + (" (quick)" if args.quick else ""))
    if rows:
        w = max(len(r[1]) for r in rows)
        print(f"{'benchmark':18s} {'metric':{w}s} {'value':>9s} {'target':>8s}  ok")
        print("-" * (w + 44))
        for bench, metric, value, target, ok in rows:
            mark = "" if ok is None else ("yes" if ok else "NO")
            print(f"{bench:18s} {metric:{w}s} {value:>9.3f} {str(target or ''):>8s}  {mark}")
    md = write_markdown(rows, machine, args.quick, failed)
    pngs = plots.write_all(bl.RESULTS_DIR)
    print(f"\nsummary: {md}; plots: {', '.join(os.path.basename(p) for p in pngs) or 'none'}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    print(f"\n{len(ran)} benchmarks in {time.monotonic() - t_all:.0f} s; raw JSON in {bl.RESULTS_DIR}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
