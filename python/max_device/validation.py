"""Checks a plugin version passes before it goes live.

``validate=True``: before publish, each kernel of the new version runs the
checks of ``max_device.testing.check_plugin`` (OpInfo samples, float32) on
max_device, with the new version staged for the validating thread only.
Any mismatch refuses the version with a per-op report; the current version
keeps serving.

``preflight=True`` (the default of ``watch()``): before the new build is
opened in this process, a *fork* of this process (torch already imported,
so it costs milliseconds) opens the exact snapshot, runs its constructors
and init and, with ``validate``, the comparison. A build that crashes,
aborts, throws or hangs there is refused while this process keeps serving.

``isolate=True``: the same in a fresh interpreter (seconds: it imports
torch), for when forking this process is not wanted.
"""

import dataclasses
import faulthandler
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional

from .errors import PluginError
from .testing import check_ops


class ValidationError(PluginError):
    """A new plugin version failed its checks; nothing was changed.
    ``report`` lists the failing samples (``testing.SampleFailure``: op,
    OpInfo sample, max abs and rel error) when the kernels disagreed with
    the CPU."""

    def __init__(self, message: str, *, report: Optional[List] = None, **where):
        super().__init__(message, **where)
        self.report = list(report or [])


def _describe_failure(failure: dict) -> str:
    """A failing sample reported by a child process, on one line."""
    return (f"{failure['op']} [{failure['source']}, {failure['dtype']}, {failure['variant']} #{failure['sample']}] "
            f"{failure['description']}: max abs {failure['max_abs']:.3g}, max rel {failure['max_rel']:.3g}")


def _format(report) -> str:
    lines = [f"  {m}" for m in report[:20]]
    if len(report) > 20:
        lines.append(f"  ... and {len(report) - 20} more")
    return "\n".join(lines)


def validate_in_process(path: str, plugin: str, **check_options) -> Callable[[List[str]], None]:
    """The registry's before_publish check for ``validate=True``."""
    def check(ops: List[str]) -> None:
        # No owner: the staged version is not listed, so every sample is judged.
        mismatches = [f for result in check_ops(ops, **check_options) for f in result.failures]
        if mismatches:
            raise ValidationError(
                f"plugin '{plugin}' ({path}): {len(mismatches)} OpInfo samples disagree with the CPU; "
                f"the new version was not published:\n{_format(mismatches)}",
                report=mismatches, file=path, plugin=plugin, op=mismatches[0].op)
    return check


def _refusal(path: str, plugin: str, where: str, status: int, detail: str) -> "ValidationError":
    """The error for a child that did not come back clean."""
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return ValidationError(f"plugin '{plugin}' ({path}): the new build crashed with {name} in the {where}; "
                               f"it was not loaded and the current version keeps serving\n{detail}",
                               file=path, plugin=plugin)
    return ValidationError(f"plugin '{plugin}' ({path}): the {where} failed: {detail}; it was not loaded",
                           file=path, plugin=plugin)


def preflight_check(path: str, plugin: str, reload: bool, validate: bool, timeout: float, *, samples=None,
                    references=None) -> Callable[[str], None]:
    """The registry's before_open check for ``preflight=True``: a forked
    child opens (and with ``validate`` checks, ``samples`` and ``references``
    included) the snapshot first."""
    def check(snapshot: str) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report on the pipe, never return into the caller
            code = 1
            try:
                os.close(read_end)
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash here is expected: no core file,
                faulthandler.disable()                              # no traceback (the parent reports it)
                result = _preflight_child(snapshot, plugin, reload, validate, samples, references)
                code = 0 if "ok" in result else 1
            except BaseException as e:  # noqa: B036 - everything must be reported
                result = {"error": f"{type(e).__name__}: {e}"}
            try:
                os.write(write_end, json.dumps(result, default=str).encode())
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            output, status = _collect(pid, read_end, timeout)
        finally:
            os.close(read_end)
        if status is None:
            raise ValidationError(f"plugin '{plugin}' ({path}): the pre-flight child did not finish within "
                                  f"{timeout:g} s (hang?); it was killed and the build was not loaded",
                                  file=path, plugin=plugin)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return
        try:
            result = json.loads(output)
        except ValueError:
            result = {}
        if result.get("mismatches") is not None:
            report = result["mismatches"]
            raise ValidationError(f"plugin '{plugin}' ({path}): {result['error']}; the new version was not "
                                  f"published:\n{_format([_describe_failure(m) for m in report])}",
                                  report=report, file=path, plugin=plugin)
        raise _refusal(path, plugin, "pre-flight child (a fork of this process)", status, result.get("error", ""))
    return check


def _collect(pid: int, fd: int, timeout: float):
    """(what the child wrote, its wait status), or (..., None) after
    killing a child that outlived ``timeout``."""
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return b"".join(chunks), None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status


def _preflight_child(snapshot: str, plugin: str, reload: bool, validate: bool, samples, references) -> dict:
    """In the forked child: open the snapshot, init it, and optionally check
    its kernels through a real (child-only) load."""
    from . import _C
    if not validate:
        _C._trial_open(os.fsencode(snapshot), plugin)
        return {"ok": True}
    from . import plugins
    # The parent's OpenMP threads do not exist here, and libgomp would wait
    # for them in the child's first parallel region: run on this thread.
    import torch
    torch.set_num_threads(1)
    _C._abandon_change_after_fork()
    try:
        checks = dict(validate=True, preflight=False, samples=samples, references=references)
        if reload:
            plugins.reload_plugin(plugin, snapshot, force=True, **checks)
        else:
            plugins.load_plugin(snapshot, name=plugin, **checks)
    except ValidationError as e:
        return {"error": f"{len(e.report)} OpInfo samples disagree with the CPU (checked in the pre-flight child)",
                "mismatches": [dataclasses.asdict(m) for m in e.report]}
    finally:
        _C._remove_snapshot_directory()
    return {"ok": True}


def isolated_check(path: str, plugin: str, validate: bool, timeout: float) -> Callable[[str], None]:
    """The registry's before_open check for ``isolate=True``."""
    def check(snapshot: str) -> None:
        command = [sys.executable, "-m", "max_device._isolated", snapshot, "--name", plugin]
        if validate:
            command.append("--validate")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check did not finish within "
                                  f"{timeout:g} s (hang?); not loaded", file=path, plugin=plugin) from None
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check crashed with {name}; "
                                  f"not loaded\n{done.stderr[-2000:]}", file=path, plugin=plugin)
        if done.returncode != 0:
            try:
                result = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                result = {"error": done.stderr.strip()[-2000:] or f"exit status {done.returncode}"}
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check failed: "
                                  f"{result.get('error', '')}", report=result.get("mismatches"),
                                  file=path, plugin=plugin)
    return check
