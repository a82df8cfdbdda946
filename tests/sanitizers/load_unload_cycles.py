"""Loads and unloads each plugin given, `cycles` times, through the public
API; tests/sanitizers/leak_check.sh runs it under LeakSanitizer.

    python load_unload_cycles.py <cycles> <plugin.so>...
"""
import sys

import max_device


def main(cycles: int, paths: list) -> None:
    for _ in range(cycles):
        for path in paths:
            plugin = max_device.load_plugin(path)
            report = max_device.unload_plugin(plugin)
            # A library left mapped would keep its memory: not a fair cycle.
            if not report["unmapped"]:
                sys.exit(f"{path} stayed mapped after unload: {report}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
