"""all_reduce bandwidth on max_device tensors vs CPU tensors, over the same
Gloo process group (init_process_group("gloo"), 2 ranks on loopback), from
1 KB to 64 MB of float32. max_device hands Gloo CPU aliases of its memory,
so the two should move data equally fast; the ratio shows what the
max_device path adds per call.

Each repetition runs one all_reduce per device (which goes first
alternates) and times it; the figures are medians. Bandwidth is the bytes reduced per second (for 2
ranks the bus bandwidth is the same).

    PYTHONPATH=python .venv/bin/python bench/bench_distributed.py [--quick]

Writes bench/results/distributed.json (raw samples, machine).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

WORLD = 2
SIZES = [1 << k for k in range(10, 27, 2)]  # bytes: 1 KB, 4 KB, ..., 64 MB
# repetitions per size: many for small messages, fewer for large ones
FULL = (200, 20)
QUICK = (40, 3)


def repetitions(nbytes: int, quick: bool) -> int:
    most, least = QUICK if quick else FULL
    return max(least, min(most, (most * 64 * 1024) // nbytes))


def worker(rank: int, store: str, quick: bool) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import max_device  # noqa: F401  (Gloo serves max_device)

    torch.max_device.set_device(rank % torch.max_device.device_count())
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    samples = {"cpu": {}, "max_device": {}}
    for nbytes in SIZES:
        tensors = {device: torch.ones(nbytes // 4, device=device) for device in samples}
        for device in samples:  # warm up (Gloo's buffers, the first call's setup)
            dist.all_reduce(tensors[device])
        times = {device: [] for device in samples}
        order = list(tensors.items())
        for _ in range(repetitions(nbytes, quick)):
            order.reverse()  # neither device always goes first
            for device, t in order:
                started = time.perf_counter()
                dist.all_reduce(t)
                times[device].append(time.perf_counter() - started)
        for device in samples:
            samples[device][nbytes] = times[device]
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(samples))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(bl.RESULTS_DIR, "distributed.json"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # rank, in a worker
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.store, args.quick)
        return

    machine = bl.machine()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        env = dict(bl.child_env(), GLOO_SOCKET_IFNAME="lo", MAX_DEVICE_COUNT=str(WORLD))
        ranks = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), "--store", store]
                                  + (["--quick"] if args.quick else []),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(WORLD)]
        outputs = [rank.communicate(timeout=1800) for rank in ranks]
    for r, (rank, (_, err)) in enumerate(zip(ranks, outputs)):
        if rank.returncode != 0:
            sys.exit(f"rank {r} failed ({rank.returncode}):\n{err}")
    raw = json.loads(outputs[0][0].strip().splitlines()[-1])

    rows = []
    for nbytes in SIZES:
        stats = {device: bl.summarize(raw[device][str(nbytes)]) for device in raw}
        cpu, dev = stats["cpu"]["median"], stats["max_device"]["median"]
        rows.append({"bytes": nbytes, "cpu_us": cpu * 1e6, "max_device_us": dev * 1e6,
                     "cpu_GBps": nbytes / cpu / 1e9, "max_device_GBps": nbytes / dev / 1e9,
                     "ratio_time": dev / cpu, "n": stats["cpu"]["n"]})

    bl.print_machine(machine, args.quick)
    print(f"all_reduce, {WORLD} ranks, Gloo on loopback, float32 (medians)")
    bl.print_header(f"{'size':>8} {'cpu us':>10} {'max_device us':>14} {'cpu GB/s':>9} {'max_device GB/s':>16} "
                    f"{'time ratio':>10} {'n':>4}")
    for r in rows:
        size = f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB"
        print(f"{size:>8} {r['cpu_us']:>10.1f} {r['max_device_us']:>14.1f} {r['cpu_GBps']:>9.3f} "
              f"{r['max_device_GBps']:>16.3f} {r['ratio_time']:>10.2f} {r['n']:>4}")
    small, large = rows[0], rows[-1]
    summary = [{"metric": "all_reduce max_device / cpu time, 1 KB", "value": round(small["ratio_time"], 3),
                "target": None, "ok": None},
               {"metric": "all_reduce max_device / cpu time, 64 MB", "value": round(large["ratio_time"], 3),
                "target": None, "ok": None},
               {"metric": "all_reduce max_device GB/s, 64 MB", "value": round(large["max_device_GBps"], 3),
                "target": None, "ok": None}]
    bl.write_json("distributed.json", {"machine": machine, "world_size": WORLD, "results": rows,
                                       "samples_s": raw, "summary": summary}, args.out)


if __name__ == "__main__":
    main()
