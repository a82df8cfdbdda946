#!/usr/bin/env bash
# Makes <tree>/python/max_device an importable max_device package: the
# libraries a build tree with its own MAXDEV_PACKAGE_DIR put there, symlinks
# to the .py files of python/max_device, and the plugin SDK (as `make build`
# does for python/). Used by the sanitizer and torch-compat runs, which put
# <tree>/python first on PYTHONPATH.
#
#   tests/link_package.sh <build tree>
set -euo pipefail
tree=$(realpath "${1:?build tree}")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pkg_src=$repo/python/max_device
pkg=$tree/python/max_device
[[ -n $(compgen -G "$pkg/_C*.so") ]] || { echo "$pkg has no _C module: build the tree first" >&2; exit 2; }
# Refresh the symlinks to the Python sources (files may come and go).
find "$pkg" -maxdepth 1 -type l -delete
for f in "$pkg_src"/*; do
  case ${f##*/} in
    *.so|sdk|__pycache__) ;;
    *) ln -s "$f" "$pkg/${f##*/}" ;;
  esac
done
cmake --install "$tree" --component plugin_api --prefix "$pkg/sdk" >/dev/null
