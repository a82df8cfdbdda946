"""make test-opinfo-full: every shard of MAXDEV_OPINFO=full, a summary at the end.

Runs tests/python/test_opinfo.py once per shard (MAXDEV_OPINFO_SHARD=i/n,
every configuration), `--jobs` shards at a time, each with its log and
JUnit XML under `--out`. The table at the end has one row per shard and
configuration (passed, failed, skipped, known failures) with the shard's
wall and CPU time, then the known failures by diagnosis category (the
reason's prefix in KNOWN_FAILURES) and every failing test. Exits 1 when a
shard fails: a failure not in KNOWN_FAILURES, or a known one that passed
(strict xfail).
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_OF_CLASS = re.compile(r"TestOpInfo(\w+)MAX_DEVICE")


def start(shard, count, args):
    """Starts one shard; (process, log file, xml path, start time)."""
    xml = os.path.join(args.out, f"shard-{shard}.xml")
    log = open(os.path.join(args.out, f"shard-{shard}.log"), "w")
    env = dict(os.environ, MAXDEV_OPINFO="full", MAXDEV_OPINFO_SHARD=f"{shard}/{count}",
               MAXDEV_BUILD_DIR=args.build_dir, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "pytest", os.path.join(ROOT, "tests/python/test_opinfo.py"), "-q",
               "-p", "no:cacheprovider", "-rfE", f"--junitxml={xml}"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, log, xml, time.monotonic()


def outcomes(xml):
    """{configuration: Counter of outcomes}, [failing test ids], Counter of
    known-failure categories, from a shard's JUnit XML."""
    counts = collections.defaultdict(collections.Counter)
    failing, categories = [], collections.Counter()
    if not os.path.isfile(xml):
        return counts, ["(no JUnit XML: the shard did not finish)"], categories
    for case in ET.parse(xml).iter("testcase"):
        match = CONFIG_OF_CLASS.search(case.get("classname", ""))
        config = match.group(1) if match else case.get("classname", "?")
        result = next(iter(case.findall("failure") + case.findall("error") + case.findall("skipped")), None)
        if result is None:
            counts[config]["passed"] += 1
        elif result.tag == "skipped" and result.get("type") == "pytest.xfail":
            counts[config]["xfailed"] += 1
            categories[result.get("message", "").split(":")[0].strip()] += 1
        elif result.tag == "skipped":
            counts[config]["skipped"] += 1
        else:
            counts[config]["failed"] += 1
            failing.append(f"{case.get('classname').split('.')[-1]}::{case.get('name')}")
    return counts, failing, categories


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8, help="how many shards (default 8)")
    parser.add_argument("--only", type=int, nargs="*", help="run these shards only (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="shards at a time (default 2)")
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "opinfo-full"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    pending = list(args.only if args.only is not None else range(args.shards))
    running, finished = {}, {}
    began = time.monotonic()
    while pending or running:
        while pending and len(running) < args.jobs:
            shard = pending.pop(0)
            running[shard] = start(shard, args.shards, args)
            print(f"shard {shard}/{args.shards}: started", flush=True)
        pid, status, usage = os.wait4(-1, 0)
        shard = next(s for s, run in running.items() if run[0].pid == pid)
        process, log, xml, started = running.pop(shard)
        log.close()
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        finished[shard] = (process.returncode, time.monotonic() - started, usage.ru_utime + usage.ru_stime, xml)
        print(f"shard {shard}/{args.shards}: exit {process.returncode} after {finished[shard][1] / 60:.1f} min",
              flush=True)
    report(finished, args, time.monotonic() - began)
    return 0 if all(code == 0 for code, *_ in finished.values()) else 1


def report(finished, args, total_wall):
    """Prints the table, the categories and the failing tests; finished:
    shard -> (exit code, wall s, CPU s, JUnit XML path)."""
    rows, failing, categories, totals = [], [], collections.Counter(), collections.defaultdict(collections.Counter)
    for shard in sorted(finished):
        code, wall, cpu, xml = finished[shard]
        counts, shard_failing, shard_categories = outcomes(xml)
        failing += [f"shard {shard}: {test}" for test in shard_failing]
        categories += shard_categories
        for config in sorted(counts):
            c = counts[config]
            totals[config] += c
            rows.append((f"{shard}", config, c["passed"], c["failed"], c["skipped"], c["xfailed"],
                         f"{wall / 60:.1f}", f"{cpu / 60:.1f}", "ok" if code == 0 else f"FAIL ({code})"))
        if not counts:
            rows.append((f"{shard}", "-", 0, 0, 0, 0, f"{wall / 60:.1f}", f"{cpu / 60:.1f}", f"FAIL ({code})"))
    for config in sorted(totals):
        c = totals[config]
        rows.append(("all", config, c["passed"], c["failed"], c["skipped"], c["xfailed"], "", "", ""))

    header = ("shard", "configuration", "passed", "failed", "skipped", "xfailed", "wall min", "cpu min", "result")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    total_cpu = sum(cpu for _, _, cpu, _ in finished.values())
    print(f"\nOpInfo full run, {len(finished)} of {args.shards} shards, {args.jobs} at a time: "
          f"{total_wall / 60:.1f} min wall, {total_cpu / 60:.1f} CPU min")
    for row in [header] + rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(row, widths)))
    print("\nknown failures (strict xfail) by category:")
    for category, n in categories.most_common():
        print(f"  {n:5d}  {category}")
    if failing:
        print(f"\n{len(failing)} failing (logs and JUnit XML in {args.out}):")
        for test in failing:
            print(f"  {test}")


if __name__ == "__main__":
    sys.exit(main())
