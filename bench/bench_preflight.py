"""What the development loop's gates cost per reload of the reference
plugin (22 kernels), in one process, alternating two builds so that every
reload publishes:

  plain      reload_plugin(p)                     no gate
  preflight  reload_plugin(p, preflight=True)     a fork of this process opens + inits the build
  isolate    reload_plugin(p, isolate=True)       a fresh interpreter does (imports torch)

Target: pre-flight <= 150 ms (watch()'s default gate).

    PYTHONPATH=python .venv/bin/python bench/bench_preflight.py [--quick]

Writes bench/results/preflight.json (raw samples, machine).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

TARGET_PREFLIGHT_MS = 150.0
# reloads per gate (plain, preflight, isolate)
FULL = (40, 40, 5)
QUICK = (10, 10, 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(bl.RESULTS_DIR, "preflight.json"))
    args = parser.parse_args()
    counts = dict(zip(("plain", "preflight", "isolate"), QUICK if args.quick else FULL))

    import max_device

    max_device.set_log_level("warn")
    builds = [bl.artifact("plugins", "libreference.so"), bl.artifact("plugins", "libreference_v2.so")]
    machine = bl.machine()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "libreference.so")
        shutil.copyfile(builds[0], path)
        plugin = max_device.load_plugin(path)
        samples = {}
        for gate, n in counts.items():
            options = {} if gate == "plain" else {gate: True}
            times = []
            for i in range(n + 1):  # the first one warms up
                staged = path + ".tmp"
                shutil.copyfile(builds[(i + 1) % 2], staged)
                os.replace(staged, path)
                t0 = time.perf_counter()
                max_device.reload_plugin(plugin, **options)
                times.append((time.perf_counter() - t0) * 1e3)
            samples[gate] = times[1:]
        max_device.unload_plugin(plugin)

    stats = {gate: bl.summarize(t) for gate, t in samples.items()}
    bl.print_machine(machine, args.quick)
    bl.print_header(f"{'gate':<10} {'median ms':>10} {'p10':>8} {'p90':>8} {'n':>4}")
    for gate, s in stats.items():
        print(f"{gate:<10} {s['median']:>10.1f} {s['p10']:>8.1f} {s['p90']:>8.1f} {s['n']:>4}")
    preflight = stats["preflight"]["median"]
    summary = [{"metric": "reload with pre-flight (fork), ms", "value": round(preflight, 1),
                "target": f"<= {TARGET_PREFLIGHT_MS:g}", "ok": preflight <= TARGET_PREFLIGHT_MS},
               {"metric": "reload with isolate (fresh interpreter), ms", "value": round(stats["isolate"]["median"], 1),
                "target": None, "ok": None}]
    bl.write_json("preflight.json", {"machine": machine, "samples_ms": samples, "stats": stats,
                                     "summary": summary}, args.out)


if __name__ == "__main__":
    main()
