"""Training-step time of the small GPT of examples/gpt.py under torch.compile
(Inductor), on max_device and on the CPU, next to eager on max_device:

  eager_max_device     max_device eager (CPU fallback kernels, no plugin)
  compiled_max_device  Inductor on max_device: its generated C++ kernels on
                       max_device memory, extern ops through the dispatcher
  compiled_cpu         Inductor on the CPU: the same generated code

The loss (forward) and its backward are compiled with fullgraph=True; the
AdamW step runs eager (fused=True) in every variant. All variants run in
one process, interleaved in rotating order. Target: compiled on max_device
within 1.1x of compiled on the CPU.

Each step is timed twice: wall clock, and the CPU time of the whole process
(all threads: a backward started on a thread other than the one that
imported max_device runs on PyTorch's autograd device thread). On a shared
machine the wall clock also counts the time threads wait to be scheduled;
CPU time does not.

    PYTHONPATH=python .venv/bin/python bench/bench_compile.py [--quick]

Writes bench/results/compile.json (samples, compile times, machine).
"""

import argparse
import dataclasses
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402

sys.path.insert(0, os.path.join(bl.REPO, "examples"))
import gpt  # noqa: E402
import max_device  # noqa: E402

VARIANTS = ("eager_max_device", "compiled_max_device", "compiled_cpu")
SEED = 0
CONFIG, BATCH = gpt.GPTConfig(), 4
# (rounds, timed steps per block, untimed steps before each block)
FULL = (15, 10, 2)
QUICK = (4, 4, 1)
TARGET = 1.1


def model_loss(model, tokens, targets):
    return model.loss(tokens, targets)


class Variant:
    def __init__(self, name):
        self.device = "cpu" if name.endswith("_cpu") else "max_device"
        self.model = gpt.make_model(CONFIG, SEED, self.device)
        self.optimizer = gpt.make_optimizer(self.model)
        self.loss = torch.compile(model_loss, fullgraph=True) if name.startswith("compiled") else model_loss
        tokens, targets = next(gpt.batches(CONFIG, BATCH, steps=1, seed=SEED))
        self.tokens, self.targets = tokens.to(self.device), targets.to(self.device)

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.model, self.tokens, self.targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def timed_step_ns(self):
        """(wall, process CPU) nanoseconds of one step."""
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        self.step()
        return time.perf_counter_ns() - wall, time.process_time_ns() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--out", help="result file (default bench/results/compile.json)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds, steps, warmup = QUICK if args.quick else FULL
    machine, load_start = bl.machine(), bl.loadavg()

    variants = {name: Variant(name) for name in VARIANTS}
    first_step_s, first_loss = {}, {}
    for name, v in variants.items():  # the first step compiles (g++ on this machine)
        t0 = time.perf_counter()
        first_loss[name] = v.step().item()
        first_step_s[name] = time.perf_counter() - t0
    for name, loss in first_loss.items():
        assert abs(loss - first_loss["compiled_cpu"]) < 1e-4, f"{name}: first loss {loss}"

    samples = {name: [] for name in VARIANTS}
    cpu_samples = {name: [] for name in VARIANTS}
    for i in range(rounds):
        for name in VARIANTS[i % 3:] + VARIANTS[:i % 3]:
            for _ in range(warmup):
                variants[name].step()
            for wall, cpu in (variants[name].timed_step_ns() for _ in range(steps)):
                samples[name].append(wall)
                cpu_samples[name].append(cpu)
    stats = {name: bl.summarize(s) for name, s in samples.items()}
    cpu_stats = {name: bl.summarize(s) for name, s in cpu_samples.items()}
    median = {name: s["median"] for name, s in stats.items()}
    ratio = median["compiled_max_device"] / median["compiled_cpu"]
    cpu_ratio = cpu_stats["compiled_max_device"]["median"] / cpu_stats["compiled_cpu"]["median"]
    speedup = median["eager_max_device"] / median["compiled_max_device"]

    summary = [
        {"metric": "gpt train step, compiled max_device / compiled cpu", "value": ratio,
         "target": TARGET, "ok": ratio <= TARGET},
        {"metric": "gpt train step, compiled max_device / compiled cpu, process CPU time", "value": cpu_ratio,
         "target": TARGET, "ok": cpu_ratio <= TARGET},
        {"metric": "gpt train step, eager max_device / compiled max_device", "value": speedup,
         "target": None, "ok": None},
    ]
    report = {"benchmark": "bench_compile", "quick": args.quick, "machine": machine,
              "loadavg_start": load_start, "loadavg_end": bl.loadavg(),
              "config": {"rounds": rounds, "steps_per_block": steps, "warmup_steps": warmup,
                         "batch_size": BATCH, "model": dataclasses.asdict(CONFIG)},
              "first_step_s": first_step_s, "stats_ns": stats, "cpu_stats_ns": cpu_stats, "summary": summary,
              "samples_ns": samples, "cpu_samples_ns": cpu_samples}
    path = bl.write_json("compile.json", report, args.out)

    bl.print_machine(machine, args.quick)
    bl.print_header(f"{'variant':22s} {'median ms':>10s} {'p10..p90 ms':>15s} {'CPU ms':>7s} {'first step s':>13s} "
                    f"{'n':>4s}")
    for name in VARIANTS:
        s = stats[name]
        print(f"{name:22s} {s['median'] / 1e6:>10.2f} {s['p10'] / 1e6:>7.2f}..{s['p90'] / 1e6:<7.2f} "
              f"{cpu_stats[name]['median'] / 1e6:>7.2f} {first_step_s[name]:>13.1f} {s['n']:>4d}")
    print(f"\ncompiled max_device / compiled cpu: {ratio:.2f}x wall, {cpu_ratio:.2f}x process CPU time "
          f"(target <= {TARGET}x); "
          f"compiled is {speedup:.2f}x faster than eager on max_device")
    print(f"raw samples: {path}")


if __name__ == "__main__":
    main()
