"""Child process of an isolated check (validation.isolated_check): open a
plugin snapshot, optionally check its kernels (testing.check_plugin), and
report on the last line of stdout as JSON. Exit 0: fine; 1: refused."""

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("--name", required=True)
    parser.add_argument("--validate", action="store_true")
    args = parser.parse_args()

    import max_device
    from max_device.testing import check_plugin

    try:
        plugin = max_device.load_plugin(args.snapshot, name=args.name)
    except max_device.PluginError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    mismatches = []
    if args.validate:
        mismatches = [f for r in check_plugin(plugin, quiet=True).to_json()["results"] for f in r["failures"]]
    if mismatches:
        print(json.dumps({"error": f"{len(mismatches)} OpInfo samples disagree with the CPU",
                          "mismatches": mismatches}))
        return 1
    print(json.dumps({"ok": True, "ops": plugin.ops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
