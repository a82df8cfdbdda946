"""Child process of an isolated check (validation.isolated_check): open a
plugin snapshot as ``load_plugin`` does, with ``--validate`` running the
very checks of ``validate=True`` (the samples and references arrive pickled
on stdin with ``--checks-on-stdin``), and report on the last line of stdout
as JSON. Exit 0: fine; 1: refused."""

import argparse
import dataclasses
import json
import pickle
import sys


def _checks_from_stdin() -> dict:
    """samples=/references= as the parent sent them (validation.isolated_payload)."""
    payload = pickle.loads(sys.stdin.buffer.read())
    sys.path.extend(p for p in payload["sys_path"] if p not in sys.path)
    sent = pickle.loads(payload["checks"])
    if sent["samples_file"] is not None:
        return {"samples": sent["samples_file"], "references": sent["references"]}
    return {"samples": sent["samples"], "references": sent["references"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("--name", required=True)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--allow-composite", action="store_true")
    parser.add_argument("--checks-on-stdin", action="store_true")
    args = parser.parse_args()

    import max_device

    try:
        checks = _checks_from_stdin() if args.checks_on_stdin else {}
    except Exception as e:  # noqa: BLE001 - whatever stops the samples from arriving is reported
        print(json.dumps({"error": f"the samples/references could not be loaded here: {type(e).__name__}: {e}"}))
        return 1
    try:
        plugin = max_device.load_plugin(args.snapshot, name=args.name, validate=args.validate,
                                        allow_composite=args.allow_composite, **checks)
    except max_device.ValidationError as e:
        print(json.dumps({"error": f"{len(e.report)} samples disagree with the CPU (checked in the isolated child)",
                          "mismatches": [dataclasses.asdict(m) for m in e.report]}, default=str))
        return 1
    except (max_device.PluginError, ValueError, TypeError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps({"ok": True, "ops": plugin.ops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
