"""Rebuilds of a plugin while two threads call its kernels and check every
result: under watch(), and under a thread that calls reload() in a loop.
The writers: `cmake --build` of a real project (ld.bfd writes the output in
place and publishes it before it is finished), a writer in place that
pauses halfway, a presized writer that writes the end first and pauses,
and a rename into place. Every version ever published must be a finished
build, and every call must return a right result. MAXDEV_REBUILDS sets the
rebuilds per writer and mode (the soak: 500)."""

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

import max_device
from conftest import REPO_ROOT

DEVICE = "max_device"
REBUILDS = int(os.environ.get("MAXDEV_REBUILDS", "12"))
CMAKE_LISTS = """cmake_minimum_required(VERSION 3.18)
project(kernels LANGUAGES C)
find_package(MaxDevicePlugin 1.0 REQUIRED)
max_device_add_plugin(kernels SOURCES kernels.c)
target_link_libraries(kernels PRIVATE m)
"""


# Build tools run without a sanitizer runtime the tests may be preloaded with.
BUILD_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


class Project:
    """The reference plugin's source as an out-of-tree project whose
    version (1 or 2) is set by rewriting its source and rebuilding."""

    def __init__(self, root):
        self.src, self.build = root / "src", root / "build"
        self.src.mkdir()
        (self.src / "CMakeLists.txt").write_text(CMAKE_LISTS)
        self.source = open(os.path.join(REPO_ROOT, "plugins", "reference", "reference.c")).read()
        self.output = str(self.build / "libkernels.so")
        self.finished = set()  # sha256 of every finished build
        cmake_dir = subprocess.run([sys.executable, "-m", "max_device", "--cmake-dir"], capture_output=True,
                                   text=True, check=True).stdout.strip()
        self.rebuild(1, configure=["cmake", "-S", str(self.src), "-B", str(self.build),
                                   f"-DMaxDevicePlugin_DIR={cmake_dir}", "-DCMAKE_BUILD_TYPE=Release"])

    def rebuild(self, version, configure=None):
        (self.src / "kernels.c").write_text(f"#define REFERENCE_VERSION {version}\n{self.source}")
        if configure:
            subprocess.run(configure, check=True, capture_output=True, env=BUILD_ENV)
        subprocess.run(["cmake", "--build", str(self.build)], check=True, capture_output=True, env=BUILD_ENV)
        digest = hashlib.sha256(open(self.output, "rb").read()).hexdigest()
        self.finished.add(digest)
        return digest


class FileWriter:
    """Writes one of two finished builds over a plugin file the way some
    tool would, pausing longer than watch()'s debounce where it can."""

    PAUSE = 0.12

    def __init__(self, kind, target, builds):
        self.kind, self.target = kind, target
        self.builds = [open(b, "rb").read() for b in builds]
        self.finished = {hashlib.sha256(b).hexdigest() for b in self.builds}

    def rebuild(self, version):
        data = self.builds[version - 1]
        half = len(data) // 2
        if self.kind == "rename":
            with open(self.target + ".tmp", "wb") as f:
                f.write(data)
            os.replace(self.target + ".tmp", self.target)
        elif self.kind == "in_place":
            with open(self.target, "r+b") as f:
                f.truncate(0)
                f.write(data[:half])
                f.flush()
                time.sleep(self.PAUSE)
                f.write(data[half:])
        else:  # presized: the size first, the end next, the start last
            with open(self.target, "r+b") as f:
                f.truncate(len(data))
                f.seek(half)
                f.write(data[half:])
                f.flush()
                time.sleep(self.PAUSE)
                f.seek(0)
                f.write(data[:half])
        return hashlib.sha256(data).hexdigest()


WRITERS = ["cmake", "in_place", "presized", "rename"]


@pytest.fixture(params=WRITERS)
def writer(request, tmp_path, plugin_file):
    """(the plugin file, a writer with .rebuild(version) -> sha256 and
    .finished, the set of finished builds' sha256)."""
    if request.param == "cmake":
        if shutil.which("cmake") is None:
            pytest.skip("cmake is not installed")
        project = Project(tmp_path)
        return project.output, project
    target = str(tmp_path / "libkernels.so")
    shutil.copyfile(plugin_file("reference"), target)
    return target, FileWriter(request.param, target, [plugin_file("reference"), plugin_file("reference_v2")])


class Callers:
    """Two threads calling the plugin's ops and checking every result."""

    def __init__(self):
        self.stop, self.failures, self.calls = threading.Event(), [], [0, 0]
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(2)]

    def run(self, index):
        a, b = torch.randn(256), torch.randn(256)
        ad, bd, probe = a.to(DEVICE), b.to(DEVICE), torch.zeros(4, device=DEVICE)
        while not self.stop.is_set():
            try:
                served = torch.ops.reference.version(probe).cpu()
                if served[0].item() not in (1.0, 2.0) or not torch.equal(served, served[0].expand(4)):
                    self.failures.append(f"reference::version returned {served.tolist()}")
                torch.testing.assert_close(torch.add(ad, bd).cpu(), a + b)
                self.calls[index] += 1
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                self.failures.append(repr(e))
                return

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_rebuilds_under_watch(writer, load_plugin):
    path, project = writer
    plugin = load_plugin(path)
    with Callers() as callers, max_device.watch(path, debounce=0.05) as w:
        for i in range(REBUILDS):
            built = project.rebuild(2 - i % 2)
            deadline = time.monotonic() + 30
            while plugin.sha256 != built and time.monotonic() < deadline:
                time.sleep(0.01)
            assert plugin.sha256 == built, f"rebuild {i} was not published: {w.events()[-3:]}"
    published = [e["sha256"] for e in w.events() if e["reloaded"]]
    assert len(published) >= REBUILDS and set(published) <= project.finished
    assert callers.failures == [] and min(callers.calls) > 0


def test_rebuilds_under_a_reload_loop(writer, load_plugin):
    path, project = writer
    plugin = load_plugin(path)
    stop, published, refusals, unexpected = threading.Event(), [], {}, []

    def reload_loop():
        while not stop.is_set():
            try:
                max_device.reload_plugin(plugin)
                published.append(plugin.sha256)
            except (max_device.PluginBusyError, max_device.PluginNotFoundError, max_device.BadImageError,
                    max_device.ManifestError) as e:  # mid-build: refused, the old version serves
                refusals[type(e).__name__] = refusals.get(type(e).__name__, 0) + 1
            except Exception as e:  # noqa: BLE001
                unexpected.append(repr(e))
                return

    reloader = threading.Thread(target=reload_loop)
    with Callers() as callers:
        reloader.start()
        try:
            for i in range(REBUILDS):
                project.rebuild(2 - i % 2)
                time.sleep(0.05)
        finally:
            stop.set()
            reloader.join(60)
    max_device.reload_plugin(plugin)
    assert unexpected == [] and set(published) <= project.finished, (refusals, unexpected)
    assert plugin.sha256 in project.finished
    assert callers.failures == [] and min(callers.calls) > 0
    print(f"reloads published: {len(published)}, refused: {refusals}")
