"""Which ops PyTorch serves through another op's ``.out`` kernel.

For structured ops (``structured_delegate: add.out`` in
native_functions.yaml) PyTorch's own composite kernel allocates the output
on the device and calls the ``.out`` overload, so a plugin serving
``aten::add.out`` also serves ``aten::add.Tensor`` and ``aten::add_.Tensor``.
The yaml ships inside torch (torchgen); this reads just the two keys it
needs, line by line."""

import functools
import os
from typing import Dict, List

import torchgen


@functools.lru_cache(maxsize=None)
def _delegates() -> Dict[str, List[str]]:
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
                        "native_functions.yaml")
    by_out: Dict[str, List[str]] = {}
    current = None
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("- func:"):
                    signature = line[len("- func:"):].strip()
                    current = "aten::" + signature.split("(", 1)[0]
                elif current and line.strip().startswith("structured_delegate:"):
                    target = "aten::" + line.split(":", 1)[1].strip()
                    by_out.setdefault(target, []).append(current)
    except OSError:
        return {}
    return by_out


def derived_variants(op: str) -> List[str]:
    """Ops whose structured delegate is ``op`` (e.g. add.out -> add.Tensor, add_.Tensor)."""
    return list(_delegates().get(op, []))
