"""The max_device tour: `make demo` runs this.

1. max_device as a device: tensors, a model, the CPU fallback made visible.
2. A plugin loaded at runtime serves ops with its own kernels.
3. Who serves what: list_ops().
4. Hot swap: the plugin's source is rebuilt as version 2 while the process
   runs; the watcher reloads it; then rollback.
5. A Python override, a custom op from a C++ plugin, then unloading.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import max_device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("MAXDEV_BUILD_DIR", os.path.join(ROOT, "build"))
PLUGINS = json.load(open(os.path.join(BUILD, "test_paths.json")))["plugins"]


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 66 - len(title)))


def rebuild(output: str, version: int) -> None:
    """What a plugin author's build does: compile the plugin source. The
    linker output is written to a temporary file and renamed into place."""
    source = os.path.join(ROOT, "plugins", "reference", "reference.c")
    include = os.path.join(ROOT, "plugin_api", "include")
    subprocess.check_call([os.environ.get("CC", "cc"), "-std=c99", "-O2", "-shared", "-fPIC",
                           "-fvisibility=hidden", f"-DREFERENCE_VERSION={version}", "-I", include,
                           source, "-lm", "-o", output + ".tmp"])
    os.replace(output + ".tmp", output)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4),
                               torch.nn.LogSoftmax(dim=-1))


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # interleave with the loader's log on stderr
    section("1. max_device is a PyTorch device")
    x = torch.randn(4, 16, device="max_device")
    print(f"torch.randn(4, 16, device='max_device') -> {x.device}, {x.dtype}, {tuple(x.shape)}")
    model, reference = mlp().to("max_device"), mlp()
    out = model(x)
    same = torch.allclose(out.cpu(), reference(x.cpu()), atol=1e-6)
    print(f"an MLP on max_device: output {tuple(out.shape)} on {out.device}; equals the CPU run: {same}")
    counts = max_device.fallback_counts()
    print(f"with no plugin, {len(counts)} ops ran on the zero-copy CPU fallback, e.g. "
          + ", ".join(f"{op} x{n}" for op, n in list(counts.items())[:4]))

    section("2. Load a plugin (C, built against plugin_api/ only)")
    workdir = tempfile.mkdtemp(prefix="max_device_demo_")  # a plugin author's build output
    path = os.path.join(workdir, "libreference.so")
    shutil.copy(os.path.join(PLUGINS, "libreference.so"), path)
    print(max_device.inspect(path).__str__().splitlines()[0], "  <- inspect(): manifest, no code run")
    plugin = max_device.load_plugin(path)
    print(f"load_plugin -> {plugin}")
    max_device.reset_fallback_counts()
    out2 = model(x)
    still = sorted(max_device.fallback_counts()) or "none"
    print(f"the same MLP now runs plugin kernels; max |difference| to the fallback run: "
          f"{(out2 - out).abs().max().item():.2e}")
    print(f"ops of the MLP still on the fallback: {still}")

    section("3. Who serves what")
    table = max_device.list_ops(plugin)
    active = [row for row in table if not row["via"] and sum(l["calls"] for l in row["layers"])]
    for line in str(max_device.list_ops()).splitlines()[:1]:
        print(line)
    print("\n".join(line for line in str(table).splitlines()[1:]
                    if any(line.startswith(row["op"] + " ") for row in active)))

    section("4. Hot swap: rebuild the plugin while the process runs")
    probe = torch.zeros(2, device="max_device")
    served = lambda: int(torch.ops.reference.version(probe)[0].item())  # noqa: E731
    print(f"before: reference::version -> {served()}, generation {plugin.generation}")
    with max_device.watch(workdir, debounce=0.1) as watcher:
        rebuild(path, version=2)
        started = time.monotonic()
        while not watcher.events() and time.monotonic() - started < 10:
            time.sleep(0.02)
        print(f"rebuilt with REFERENCE_VERSION=2; the watcher reloaded it in "
              f"{time.monotonic() - started:.2f} s: {watcher.events()[-1]['message']}")
    plugin = max_device.get_plugin("reference")
    print(f"after:  reference::version -> {served()}, generation {plugin.generation}; "
          f"the MLP still matches: {torch.allclose(model(x).cpu(), out.cpu(), atol=1e-6)}")
    print("\n".join(line for line in str(max_device.list_ops(plugin)).splitlines()
                    if line.startswith(("op ", "aten::addmm.out", "reference::version"))))
    plugin = plugin.rollback()
    print(f"rollback() -> {plugin.version} (generation {plugin.generation}); "
          f"reference::version -> {served()}")

    section("5. A Python override, a custom op from a C++ plugin, unloading")
    with max_device.override("aten::relu", lambda t: t.clamp(min=0) * 0 + 7):
        print(f"inside override('aten::relu', ...): relu -> {torch.relu(probe).tolist()}")
    print(f"after the with block the stack is as before: relu -> {torch.relu(probe).tolist()}")
    sdk = max_device.load_plugin(os.path.join(PLUGINS, "libsdk_example.so"))
    w = torch.ones(16, device="max_device")
    y = torch.ops.myplug.rms_norm(x, w, 1e-6)
    ref = x.cpu() * torch.rsqrt(x.cpu().pow(2).mean(-1, keepdim=True) + 1e-6)
    print(f"torch.ops.myplug.rms_norm on max_device matches a Python reference: "
          f"{torch.allclose(y.cpu(), ref, atol=1e-5)}")
    try:
        torch.ops.myplug.rms_norm(x, torch.ones(3, device="max_device"), 1e-6)
    except max_device.KernelError as e:
        print(f"a kernel's error reaches Python typed: {type(e).__name__}: {e}")
    for p in (sdk, plugin):
        report = max_device.unload_plugin(p)
        print(f"unload_plugin({p.name!r}) -> unmapped={report['unmapped']}")
    print(f"plugins loaded now: {max_device.list_plugins()}; ops with providers: {len(max_device.list_ops())}")
    shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
