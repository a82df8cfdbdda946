"""PNG plots of the benchmark results (bench/results/*.json), for the
README; run_all.py calls write_all after the benchmarks. Not a benchmark
itself. Each plot is drawn only when its result file exists.

    .venv/bin/python bench/plots.py     # redraw from the JSON already there
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchlib as bl  # noqa: E402


def _load(results_dir, name):
    try:
        with open(os.path.join(results_dir, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _subtitle(report):
    m = report.get("machine")
    return bl.machine_line(m) + (" (quick)" if report.get("quick") else "") if m else ""


def _spread(stats, numer=None):
    """(median, lower error, upper error) of a time, or of numer / time."""
    med, lo, hi = stats["median"], stats["p10"], stats["p90"]
    if numer is None:
        return med, med - lo, hi - med
    v = numer / med
    return v, v - numer / hi, numer / lo - v


def plot_fast(report, path):
    """Speed of the fast plugin and of the fallback relative to the CPU, per case,
    with the issue's targets; p10..p90 as error bars."""
    results = report["results"]
    names = [n for n, r in results.items() if "speedup_vs_cpu" in r]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.4
    for k, variant in enumerate(("fast", "fallback")):
        vals, errs = [], [[], []]
        for n in names:
            cpu = results[n]["stats_ns"]["cpu"]["median"]
            v, lo, hi = _spread(results[n]["stats_ns"][variant], cpu)
            vals.append(v)
            errs[0].append(lo)
            errs[1].append(hi)
        ax.bar([i + (k - 0.5) * width for i in range(len(names))], vals, width, yerr=errs,
               label=f"{variant} plugin" if variant == "fast" else "fallback (no plugin)", capsize=2)
    for i, n in enumerate(names):
        t = results[n].get("target_ratio")
        if t:
            ax.plot([i - 0.45, i + 0.45], [t, t], color="red", linewidth=1.5)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("speed vs PyTorch CPU (cpu time / time)")
    ax.set_title("fast plugin throughput vs CPU (red: target)\n" + _subtitle(report), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bandwidth(report, path):
    """GB/s of the memory-bound cases next to the machine's copy bandwidth."""
    results = report["results"]
    copy = results.get("copy 2^24", {}).get("gbytes_per_s", {}).get("cpu")
    names = [n for n, r in results.items() if r["group"] == "elementwise"]
    if not copy or not names:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.4
    for k, variant in enumerate(("cpu", "fast")):
        ax.bar([i + (k - 0.5) * width for i in range(len(names))],
               [results[n]["gbytes_per_s"][variant] for n in names], width, label=variant)
    ax.axhline(copy, color="black", linewidth=1, label=f"copy {copy:.1f} GB/s")
    ax.axhline(0.8 * copy, color="red", linewidth=1, linestyle="--", label="80% of copy (target)")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title("elementwise bandwidth, 2^24 float32\n" + _subtitle(report), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_gpt(report, path):
    """GPT training step time per config and variant, relative to CPU eager."""
    results = report["results"]
    labels = list(results)
    variants = []
    for r in results.values():
        variants += [v for v in r.get("variants", r["ratio_vs_cpu"]) if v not in variants]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(variants)
    for k, v in enumerate(variants):
        xs, vals, errs = [], [], [[], []]
        for i, label in enumerate(labels):
            r = results[label]
            if v not in r["stats_ns"]:
                continue
            cpu = r["stats_ns"]["cpu"]["median"]
            s = r["stats_ns"][v]
            xs.append(i + (k - (len(variants) - 1) / 2) * width)
            vals.append(s["median"] / cpu)
            errs[0].append((s["median"] - s["p10"]) / cpu)
            errs[1].append((s["p90"] - s["median"]) / cpu)
        ax.bar(xs, vals, width, yerr=errs, label=v, capsize=2)
    ax.axhline(1.0, color="red", linewidth=1, label="CPU eager (target for fast: <= 1)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{lb} (d={results[lb]['config']['n_embd']})" for lb in labels])
    ax.set_ylabel("step time / CPU eager step time (log)")
    ax.set_title("GPT training step (examples/gpt.py)\n" + _subtitle(report), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fallback(report, path):
    """Per-call time of the CPU and the fallbacks over sizes (log-log)."""
    by_op = {}
    for r in report["results"]:
        by_op.setdefault(r["op"], []).append(r)
    fig, axes = plt.subplots(1, len(by_op), figsize=(5 * len(by_op), 4), squeeze=False)
    for ax, (op, rows) in zip(axes[0], by_op.items()):
        rows.sort(key=lambda r: r["numel"])
        for variant in rows[0]["median_ns"]:
            ax.plot([r["numel"] for r in rows], [r["median_ns"][variant] / 1e3 for r in rows],
                    marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("elements (float32)")
        ax.set_ylabel("µs per call (median)")
        ax.set_title(op, fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle("per-call time: CPU, zero-copy fallback, copying fallback\n" + _subtitle(report),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(report, path):
    """The per-op overhead sweep of torch.add: per-call time of each variant
    over sizes (log-log, p10..p90 band), and each over the CPU's."""
    sweep = report["sweep"]
    sizes = sweep["sizes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for variant, res in sweep["variants"].items():
        stats = [res["sizes"][str(n)]["stats_ns"] for n in sizes]
        left.plot(sizes, [s["median"] / 1e3 for s in stats], marker="o", markersize=3, label=variant)
        left.fill_between(sizes, [s["p10"] / 1e3 for s in stats], [s["p90"] / 1e3 for s in stats], alpha=0.2)
        cpu = [sweep["variants"]["cpu"]["sizes"][str(n)]["stats_ns"]["median"] for n in sizes]
        right.plot(sizes, [s["median"] / c for s, c in zip(stats, cpu)], marker="o", markersize=3, label=variant)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("elements (float32)")
        ax.legend(fontsize=8)
    left.set_ylabel("µs per call (median; band p10..p90)")
    right.set_ylabel("time / CPU eager time")
    right.axhline(1.0, color="gray", linewidth=0.8)
    fig.suptitle("torch.add per call: reference plugin, native kernel, Python kernel, CPU, zero-copy fallback\n" +
                 _subtitle(report), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results_dir=bl.RESULTS_DIR):
    """Draws every plot whose results exist; returns the files written."""
    written = []
    fast = _load(results_dir, "fast.json")
    if fast:
        plot_fast(fast, os.path.join(results_dir, "fast_speed.png"))
        written.append(os.path.join(results_dir, "fast_speed.png"))
        if plot_bandwidth(fast, os.path.join(results_dir, "fast_bandwidth.png")):
            written.append(os.path.join(results_dir, "fast_bandwidth.png"))
    gpt = _load(results_dir, "gpt.json")
    if gpt:
        plot_gpt(gpt, os.path.join(results_dir, "gpt_step.png"))
        written.append(os.path.join(results_dir, "gpt_step.png"))
    fallback = _load(results_dir, "fallback.json")
    if fallback:
        plot_fallback(fallback, os.path.join(results_dir, "fallback_sizes.png"))
        written.append(os.path.join(results_dir, "fallback_sizes.png"))
    plugin_call = _load(results_dir, "plugin_call.json")
    if plugin_call and plugin_call.get("sweep"):
        plot_sweep(plugin_call, os.path.join(results_dir, "per_op_sweep.png"))
        written.append(os.path.join(results_dir, "per_op_sweep.png"))
    return written


if __name__ == "__main__":
    for p in write_all():
        print(p)
