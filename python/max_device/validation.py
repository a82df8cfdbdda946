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
torch), for when forking this process is not wanted. With ``validate``
the child runs exactly what ``validate=True`` runs here, ``samples`` and
``references`` included. They cross to the child as a samples file's path
(``samples="file.py"``, read there), or pickled by reference: functions
defined at the top level of a module the child can import (it gets this
process's ``sys.path``). A lambda, a nested function or one defined in
``__main__`` cannot cross: ``TypeError`` naming the op, before anything
starts.
"""

import dataclasses
import faulthandler
import json
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional

from .errors import PluginError
from .testing import SampleFailure, check_ops


class ValidationError(PluginError):
    """A new plugin version failed its checks; nothing was changed.
    ``report`` lists the failing samples (``testing.SampleFailure``: op,
    OpInfo sample, max abs and rel error) when the kernels disagreed with
    the CPU."""

    def __init__(self, message: str, *, report: Optional[List] = None, **where):
        super().__init__(message, **where)
        self.report = list(report or [])


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
            report = [SampleFailure(**m) for m in result["mismatches"]]
            raise ValidationError(f"plugin '{plugin}' ({path}): {result['error']}; the new version was not "
                                  f"published:\n{_format(report)}",
                                  report=report, file=path, plugin=plugin, op=report[0].op if report else None)
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


def _crossing(role: str, op: str, fn, where: str) -> None:
    """Refuses (TypeError) a samples/references callable that a fresh
    interpreter cannot import by name."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    why = None
    if module == "__main__":
        why = "it is defined in __main__, which the child does not run"
    elif "<lambda>" in qualname or "<locals>" in qualname:
        why = "it is a lambda or a nested function"
    else:
        try:
            pickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - pickle raises many types; all mean "cannot cross"
            why = f"it cannot be pickled by reference ({type(e).__name__}: {e})"
    if why:
        raise TypeError(f"{where}: isolate=True cannot pass {role}[{op!r}] = {fn!r} to the child process: {why}. "
                        f"Define it at the top level of an importable module, or pass samples='file.py' "
                        f"(SAMPLES and REFERENCES dicts, as `check --samples` reads)")


def isolated_payload(samples, references, where: str) -> Optional[bytes]:
    """What the isolated child needs to run validate's checks with these
    ``samples``/``references`` (None: nothing to send). Raises TypeError for
    callables that cannot cross, so nothing has started."""
    if samples is None and not references:
        return None
    sent = {"samples_file": None, "samples": None, "references": dict(references or {})}
    if isinstance(samples, (str, bytes, os.PathLike)):
        sent["samples_file"] = os.path.abspath(os.fsdecode(samples))
    elif samples is not None:
        if not isinstance(samples, dict):
            raise TypeError(f"{where}: samples must be a dict {{op: fn(dtype)}} or a samples file's path, "
                            f"got {type(samples).__name__}")
        sent["samples"] = dict(samples)
    for role in ("samples", "references"):
        for op, fn in (sent[role] or {}).items():
            _crossing(role, op, fn, where)
    # The child extends its sys.path before it unpickles the functions.
    return pickle.dumps({"sys_path": list(sys.path), "checks": pickle.dumps(sent)})


def isolated_check(path: str, plugin: str, validate: bool, timeout: float, *, samples=None, references=None,
                   allow_composite: bool = False) -> Callable[[str], None]:
    """The registry's before_open check for ``isolate=True``: a fresh
    interpreter loads the snapshot, with ``validate`` exactly as
    ``validate=True`` does here (``samples``/``references`` included)."""
    payload = isolated_payload(samples, references, f"plugin '{plugin}' ({path})") if validate else None

    def check(snapshot: str) -> None:
        command = [sys.executable, "-m", "max_device._isolated", snapshot, "--name", plugin]
        if validate:
            command.append("--validate")
        if allow_composite:
            command.append("--allow-composite")
        if payload is not None:
            command.append("--checks-on-stdin")
        try:
            done = subprocess.run(command, input=payload or b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check did not finish within "
                                  f"{timeout:g} s (hang?); not loaded", file=path, plugin=plugin) from None
        stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check crashed with {name}; "
                                  f"not loaded\n{stderr[-2000:]}", file=path, plugin=plugin)
        if done.returncode != 0:
            try:
                result = json.loads(stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                result = {"error": stderr.strip()[-2000:] or f"exit status {done.returncode}"}
            report = [SampleFailure(**m) for m in result.get("mismatches") or []]
            detail = f":\n{_format(report)}" if report else ""
            raise ValidationError(f"plugin '{plugin}' ({path}): the isolated check failed: "
                                  f"{result.get('error', '')}{detail}", report=report,
                                  file=path, plugin=plugin, op=report[0].op if report else None)
    return check
