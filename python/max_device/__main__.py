"""python -m max_device: inspect and check plugin files, list ops, find the SDK.

  python -m max_device inspect PATH      manifest of a plugin file (runs none of its code)
  python -m max_device ops [PLUGIN...]   load the given plugin files and list who serves each op
  python -m max_device check PATH        run PyTorch's OpInfo samples on every op the plugin serves,
                                         against the CPU (plus out=, extremal and gradient checks);
                                         exit status 1 on any failure, or on a custom op no sample
                                         covers (give --samples FILE.py, or --allow-uncovered)
  python -m max_device schema NAME       every overload of an op: schema, dispatch kind, outputs,
                                         and which overload a plugin kernel should serve
  python -m max_device coverage [PLUGIN...]  how each core aten op runs: plugin, max_device,
                                         composite, CPU fallback, or not at all
  python -m max_device watch PLUGIN...   load plugin files and reload each one whenever it is rebuilt
  python -m max_device wheel PATH        package a plugin file as a Python wheel (entry point group
                                         max_device.plugins), so that pip installs it and
                                         load_plugin("name") finds it
  python -m max_device --cmake-dir       directory to pass as -DMaxDevicePlugin_DIR=
  python -m max_device --include-dir     directory holding max_device/plugin.h
"""

import argparse
import json
import os
import sys

_SDK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk")


def _sdk_path(*parts: str) -> str:
    path = os.path.join(_SDK, *parts)
    if not os.path.isdir(path):
        sys.exit(f"max_device: the plugin SDK is not installed at {path} (build with `make`, "
                 "or install the package with pip)")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m max_device", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cmake-dir", action="store_true", help="print the CMake package directory")
    parser.add_argument("--include-dir", action="store_true", help="print the plugin header directory")
    sub = parser.add_subparsers(dest="command")
    p_inspect = sub.add_parser("inspect", help="show a plugin file's manifest without loading it")
    p_inspect.add_argument("path")
    p_ops = sub.add_parser("ops", help="load plugin files and list the ops on max_device")
    p_ops.add_argument("plugins", nargs="*")
    p_check = sub.add_parser("check", help="check a plugin's kernels against the CPU on OpInfo samples")
    p_check.add_argument("path")
    p_check.add_argument("--ops", type=_comma_list, default=None,
                         help="comma-separated ops to check (default: every op the plugin serves)")
    p_check.add_argument("--dtypes", type=_comma_list, default=None,
                         help="comma-separated dtypes, e.g. float32,int64 (default: each kernel's own)")
    p_check.add_argument("--max-samples", type=int, default=8, help="samples per OpInfo and dtype")
    p_check.add_argument("--json", action="store_true", help="print the result as JSON")
    p_check.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p_check.add_argument("--samples", default=None, metavar="FILE.py",
                         help="a Python file defining SAMPLES (and REFERENCES) for custom ops")
    p_check.add_argument("--allow-uncovered", action="store_true",
                         help="exit 0 even when a custom op has no samples")
    p_schema = sub.add_parser("schema", help="show an op's overloads and which one a plugin should serve")
    p_schema.add_argument("name", help="e.g. softmax, aten::softmax, aten::softmax.int")
    p_schema.add_argument("--json", action="store_true", help="print the overloads as JSON")
    p_coverage = sub.add_parser("coverage", help="load plugin files and report how core aten ops run")
    p_coverage.add_argument("plugins", nargs="*")
    p_coverage.add_argument("--json", action="store_true", help="print the report as JSON")
    p_watch = sub.add_parser("watch", help="load plugin files and reload them when they are rebuilt")
    p_watch.add_argument("plugins", nargs="+")
    p_watch.add_argument("--debounce", type=float, default=0.2,
                         help="seconds a finished file must stay closed and unchanged (default 0.2)")
    p_watch.add_argument("--no-preflight", dest="preflight", action="store_false",
                         help="open new builds in this process directly, without the forked pre-flight")
    p_watch.add_argument("--validate", action="store_true", help="compare new kernels with the CPU before publish")
    p_watch.add_argument("--isolate", action="store_true", help="check new builds in a fresh interpreter")
    p_watch.add_argument("--seconds", type=float, default=None, help="stop after this long (default: Ctrl-C)")
    p_wheel = sub.add_parser("wheel", help="package a plugin file as a Python wheel")
    p_wheel.add_argument("path")
    p_wheel.add_argument("--name", default=None, help="the name load_plugin() will take (default: its manifest's)")
    p_wheel.add_argument("--version", default=None, help="the package version (default: its manifest's)")
    p_wheel.add_argument("--out-dir", default=".", help="where to write the wheel")
    p_wheel.add_argument("--package", default=None, help="import package (default max_device_plugin_<name>)")
    args = parser.parse_args(argv)

    if args.cmake_dir:
        print(_sdk_path("lib", "cmake", "MaxDevicePlugin"))
        return 0
    if args.include_dir:
        print(_sdk_path("include"))
        return 0

    import max_device

    commands = {"inspect": _inspect, "ops": _ops, "check": _check, "coverage": _coverage, "watch": _watch,
                "wheel": _wheel, "schema": _schema}
    if args.command not in commands:
        parser.print_help()
        return 2
    try:
        return commands[args.command](max_device, args)
    except (max_device.PluginError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _as_path(path: str) -> str:
    """A file given on the command line is that file, even without a '/'
    (a bare name that is no file here is looked up in the plugin search path)."""
    return os.path.join(".", path) if "/" not in path and os.path.isfile(path) else path


def _inspect(max_device, args) -> int:
    print(max_device.inspect(_as_path(args.path)))
    return 0


def _ops(max_device, args) -> int:
    loaded = [max_device.load_plugin(_as_path(path)) for path in args.plugins]
    print(max_device.list_ops(*loaded))
    return 0


def _wheel(max_device, args) -> int:
    """The SDK's max_device_plugin_wheel.py (standard library only, also what
    CMake's max_device_add_plugin_wheel runs), with defaults from the manifest."""
    import importlib.util

    script = os.path.join(_sdk_path("lib", "cmake", "MaxDevicePlugin"), "max_device_plugin_wheel.py")
    spec = importlib.util.spec_from_file_location("max_device_plugin_wheel", script)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    manifest = max_device.inspect(args.path)
    print(builder.build_wheel(args.path, args.name or manifest.name, args.version or manifest.version,
                              args.out_dir, args.package))
    return 0


def _comma_list(text: str):
    return [item for item in text.split(",") if item]


def _check(max_device, args) -> int:
    from max_device.testing import check_plugin

    result = check_plugin(_as_path(args.path), ops=args.ops, dtypes=args.dtypes, max_samples=args.max_samples,
                          samples=args.samples, quiet=args.quiet)
    print(json.dumps(result.to_json(), indent=2) if args.json else result)
    uncovered = [op for op in result.uncovered if not op.startswith("aten::")]
    if uncovered and not args.allow_uncovered:
        print(f"error: not covered: {', '.join(uncovered)}: no sample reached these custom ops, so nothing "
              "checked them; give samples with --samples FILE.py (SAMPLES = {op: fn(dtype) -> [(args, "
              "kwargs), ...]}, REFERENCES = {op: fn}), or pass --allow-uncovered", file=sys.stderr)
        return 1
    return 0 if result.passed else 1


def _schema(max_device, args) -> int:
    from max_device.schema import overloads

    found = overloads(args.name)
    print(json.dumps([o.to_json() for o in found], indent=2) if args.json else "\n\n".join(map(str, found)))
    return 0


def _coverage(max_device, args) -> int:
    from max_device.testing import core_op_coverage

    plugins = [max_device.load_plugin(_as_path(path)) for path in args.plugins]
    report = core_op_coverage(*plugins)
    print(json.dumps(report.to_json(), indent=2) if args.json else report)
    return 0


def _watch(max_device, args) -> int:
    import time

    plugins = [max_device.load_plugin(_as_path(path)) for path in args.plugins]
    watches = [max_device.watch(p.path, debounce=args.debounce, preflight=args.preflight, validate=args.validate,
                                isolate=args.isolate) for p in plugins]
    print(f"watching {len(plugins)} plugin(s); rebuild them to reload, Ctrl-C to stop", flush=True)
    shown = 0
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            events = [e for w in watches for e in w.events()]
            for event in events[shown:]:
                print(f"{event['file']}: {event['message']}", flush=True)
            shown = len(events)
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    for w in watches:
        w.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
