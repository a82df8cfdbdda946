#!/usr/bin/env python3
"""Package a built max_device plugin as a Python wheel.

    max_device_plugin_wheel.py PLUGIN.so --name NAME --version VERSION [--out-dir DIR]
                               [--package PACKAGE] [--distribution DISTRIBUTION]

The wheel installs PACKAGE/ (default max_device_plugin_<name>) holding the
plugin file and an empty __init__.py, and declares the entry point

    [max_device.plugins]
    NAME = PACKAGE:<plugin file name>

so that, once installed, ``max_device.load_plugin("NAME")`` finds it (after the
explicit plugin search path) and ``max_device.available_plugins()`` lists it.
The wheel's tag is py3-none-<this platform>: the plugin links no Python and
no torch. Standard library only (the SDK needs no torch); the same bytes for
the same inputs (fixed timestamps). Prints the wheel's path.

CMake: max_device_add_plugin_wheel() (MaxDevicePlugin.cmake) runs this script;
Python: ``python -m max_device wheel`` does too.
"""

import argparse
import base64
import hashlib
import os
import re
import sys
import sysconfig
import zipfile

# A fixed timestamp (the zip format's earliest) makes the wheel reproducible.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _platform_tag() -> str:
    return re.sub(r"[^\w]", "_", sysconfig.get_platform())


def build_wheel(plugin: str, name: str, version: str, out_dir: str, package: str = None,
                distribution: str = None) -> str:
    """Write the wheel into out_dir and return its path."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise ValueError(f"plugin name {name!r}: use letters, digits, '_', '.', '-'")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)", version):
        raise ValueError(f"version {version!r} is not a version number such as 1.0.0")
    package = package or "max_device_plugin_" + re.sub(r"\W", "_", name)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", package):
        raise ValueError(f"package {package!r} is not a Python package name")
    distribution = distribution or package.replace("_", "-")
    with open(plugin, "rb") as f:
        plugin_bytes = f.read()
    if plugin_bytes[:4] != b"\x7fELF":
        raise ValueError(f"{plugin} is not an ELF shared library")

    dist_name = re.sub(r"[-_.]+", "_", distribution)
    dist_info = f"{dist_name}-{version}.dist-info"
    package_dir = package.replace(".", "/")
    plugin_file = os.path.basename(plugin)
    files = [
        (f"{package_dir}/__init__.py", f'"""max_device plugin {name} {version}: {plugin_file}."""\n'.encode(),
         0o644),
        (f"{package_dir}/{plugin_file}", plugin_bytes, 0o755),
        (f"{dist_info}/METADATA", (
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
            f"Summary: max_device kernel plugin {name}\n").encode(), 0o644),
        (f"{dist_info}/WHEEL", (
            "Wheel-Version: 1.0\nGenerator: max_device_plugin_wheel\nRoot-Is-Purelib: false\n"
            f"Tag: py3-none-{_platform_tag()}\n").encode(), 0o644),
        (f"{dist_info}/entry_points.txt",
         f"[max_device.plugins]\n{name} = {package}:{plugin_file}\n".encode(), 0o644),
        (f"{dist_info}/top_level.txt", f"{package.split('.')[0]}\n".encode(), 0o644),
    ]
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data, _ in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    os.makedirs(out_dir, exist_ok=True)
    wheel = os.path.join(out_dir, f"{dist_name}-{version}-py3-none-{_platform_tag()}.whl")
    temporary = wheel + ".tmp"
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, ZIP_DATE)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    os.replace(temporary, wheel)
    return wheel


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plugin", help="the built plugin library (.so)")
    parser.add_argument("--name", required=True, help="the name load_plugin() will take")
    parser.add_argument("--version", required=True, help="the package version, e.g. the plugin's")
    parser.add_argument("--out-dir", default=".", help="where to write the wheel")
    parser.add_argument("--package", default=None, help="import package (default max_device_plugin_<name>)")
    parser.add_argument("--distribution", default=None, help="distribution name (default: the package's, with -)")
    args = parser.parse_args(argv)
    try:
        print(build_wheel(args.plugin, args.name, args.version, args.out_dir, args.package, args.distribution))
    except (OSError, ValueError) as e:
        print(f"max_device_plugin_wheel: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
