"""Shared helpers of the benchmarks: where the build is, the machine, a
subprocess runner and small statistics. Not a benchmark itself (run_all.py
runs bench_*.py only)."""

import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")


def build_dir() -> str:
    return os.environ.get("MAXDEV_BUILD_DIR") or os.path.join(REPO, "build")


def artifact(*parts: str, required: bool = True) -> Optional[str]:
    """A file under the build directory; a clear error when it is missing."""
    path = os.path.join(build_dir(), *parts)
    if os.path.exists(path):
        return path
    if required:
        sys.exit(f"{path} is missing: build it first (make build, or "
                 f"cmake --build {build_dir()} --target <target>)")
    return None


def child_env() -> Dict[str, str]:
    """The environment of a worker: the package from python/, the same build."""
    env = dict(os.environ)
    env["MAXDEV_BUILD_DIR"] = build_dir()
    py = os.path.join(REPO, "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_json(cmd: List[str], timeout: float = 600) -> dict:
    """Run a worker; its last stdout line starting with '{' is its result."""
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{proc.stdout}\n{proc.stderr}")


def machine() -> dict:
    import torch

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"nproc": os.cpu_count(), "cpu_model": model, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_1_5_15": load}


def loadavg() -> Optional[List[float]]:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep what is freed (no mmap'd chunks, no trim):
    a fresh output of a few MiB then reuses pages already mapped instead of
    paying the kernel's page faults and zeroing. Which variant's output
    lands at the top of the heap (and is trimmed on every free) is luck of
    the allocation order: measured, it made one side's softmax 2-3x slower
    than in a run of that case alone, on the CPU's side or the plugin's.
    Kernels are compared, not the OS. False where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_mmap_max = -1, -4
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def summarize(samples: List[float]) -> dict:
    s = sorted(samples)
    # "inclusive": within the samples; the default extrapolates past them, which
    # with a quick run's few samples can put p10 below zero.
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return {"median": statistics.median(s), "p10": q[0], "p90": q[-1], "min": s[0], "n": len(s)}


def write_json(name: str, report: dict, path: Optional[str] = None) -> str:
    path = path or os.path.join(RESULTS_DIR, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return path


def machine_line(m: dict) -> str:
    load = m.get("loadavg_1_5_15")
    load_s = f", load avg {load[0]:.2f}" if load else ""
    return (f"machine: {m['cpu_model']}, nproc {m['nproc']}, torch {m['torch']}, "
            f"{m['torch_threads']} torch threads{load_s}")


def print_machine(m: dict, quick: bool) -> None:
    """The machine line that heads a benchmark's printed results."""
    print()
    print(machine_line(m) + (" (quick)" if quick else ""))


def print_header(header: str) -> None:
    """A table's header line and its rule."""
    print(header)
    print("-" * len(header))
