"""Checks a plugin version passes before it goes live.

``validate=True``: before publish, each kernel of the new version runs the
checks of ``max_device.testing.check_plugin`` (OpInfo samples, float32) on
max_device, with the new version staged for the validating thread only.
Any mismatch refuses the version with a per-op report; the current version
keeps serving.

``isolate=True``: before the new build is opened in this process at all, a
child process opens the exact snapshot that would be loaded (running its
constructors and init) and, with ``validate``, runs the same comparison.
A version that crashes, aborts or hangs there is refused while this process
keeps serving.
"""

import json
import signal
import subprocess
import sys
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
