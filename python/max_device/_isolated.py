"""Child process of an isolated check (validation.isolated_check): open a
plugin snapshot, optionally compare its kernels with the CPU, and report on
the last line of stdout as JSON. Exit 0: fine; 1: refused."""

import argparse
import dataclasses
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("--name", required=True)
    parser.add_argument("--validate", action="store_true")
    args = parser.parse_args()

    import max_device
    from max_device.testing import compare_with_cpu

    try:
        plugin = max_device.load_plugin(args.snapshot, name=args.name)
    except max_device.PluginError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    mismatches = []
    if args.validate:
        mismatches = [dataclasses.asdict(m) for found in compare_with_cpu(plugin.ops).values() for m in found]
    if mismatches:
        print(json.dumps({"error": f"{len(mismatches)} OpInfo samples disagree with the CPU",
                          "mismatches": mismatches}))
        return 1
    print(json.dumps({"ok": True, "ops": plugin.ops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
