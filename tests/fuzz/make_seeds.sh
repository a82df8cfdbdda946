#!/usr/bin/env bash
# Seed corpora for the fuzz targets, from the real plugins of a build tree:
#
#   tests/fuzz/make_seeds.sh <build tree> <seed dir>
#
# <seed dir>/manifest_image    every example plugin and test fixture, as
#                              built (with .symtab and debug info) and stripped
#                              (as plugins usually ship)
# <seed dir>/manifest_records  the .maxdev_manifest section of each
set -euo pipefail

tree=${1:?build tree}
out=${2:?seed dir}
shopt -s nullglob
plugins=("$tree"/plugins/*.so "$tree"/tests/fixtures/*.so)
((${#plugins[@]})) || { echo "no plugins in $tree: build it first (make build)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/manifest_image" "$out/manifest_records"
for so in "${plugins[@]}"; do
  name=$(basename "$so" .so)
  cp "$so" "$out/manifest_image/$name.so"
  strip --strip-all -o "$out/manifest_image/$name.stripped.so" "$so"
  objcopy -O binary --only-section=.maxdev_manifest "$so" "$out/manifest_records/$name.manifest"
done
echo "seeds: ${#plugins[@]} plugins -> $out"
