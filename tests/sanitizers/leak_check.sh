#!/usr/bin/env bash
# No leak per plugin load/unload cycle: runs load_unload_cycles.py once with
# 1 cycle and once with CYCLES cycles, under LeakSanitizer (gcc's liblsan,
# preloaded: it needs no instrumented build), and fails unless both leave
# exactly the same leaked bytes and allocations at exit. What leaks once per
# process (CPython's own interpreter objects) is the same in both runs; what
# a cycle leaks would grow with CYCLES.
#
#   tests/sanitizers/leak_check.sh [plugin.so...]
#
# Default plugins: the C reference plugin and the C++ SDK example (custom op
# schema) of build/. Environment: PY (default .venv/bin/python), CYCLES
# (default 50), BUILD (default build). The Makefile's `make leak-check` runs
# this after `make build`. LeakSanitizer sees unreachable memory only; memory
# a cycle keeps reachable is bounded by the hot-swap stress test (RSS).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PY:-$repo/.venv/bin/python}
[[ $py = /* ]] || py=$repo/$py
cycles=${CYCLES:-50}
build=${BUILD:-$repo/build}
plugins=("$@")
((${#plugins[@]})) || plugins=("$build/plugins/libreference.so" "$build/plugins/libsdk_example.so")
runtime=$(${CC:-gcc} -print-file-name=liblsan.so)
[[ -f $runtime ]] || { echo "no LeakSanitizer runtime at '$runtime'" >&2; exit 2; }

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Prints "<bytes> <allocations>" leaked by a run of n cycles (0 0: none).
leaked_after() {
  local n=$1 log=$logs/cycles-$1.log
  # exitcode=0: a leak is judged by comparison here, not by LSan's exit code.
  # PYTHONMALLOC=malloc: every allocation through malloc, where LSan sees it.
  if ! LD_PRELOAD=$runtime LSAN_OPTIONS=exitcode=0 PYTHONMALLOC=malloc \
      "$py" "$here/load_unload_cycles.py" "$n" "${plugins[@]}" >"$log" 2>&1; then
    echo "load/unload run failed (cycles=$n):" >&2
    cat "$log" >&2
    exit 1
  fi
  local summary
  summary=$(grep -o 'SUMMARY: LeakSanitizer: [0-9]* byte(s) leaked in [0-9]* allocation' "$log" || true)
  if [[ -z $summary ]]; then echo "0 0"; else echo "$summary" | awk '{print $3, $7}'; fi
}

once=$(leaked_after 1)
many=$(leaked_after "$cycles")
read -r once_bytes once_allocs <<<"$once"
read -r many_bytes many_allocs <<<"$many"
echo "leak check (${plugins[*]##*/}): 1 cycle leaves $once_bytes bytes in $once_allocs allocations," \
     "$cycles cycles leave $many_bytes bytes in $many_allocs allocations"
if [[ $once_bytes != "$many_bytes" || $once_allocs != "$many_allocs" ]]; then
  echo "leaks grow with load/unload cycles; LeakSanitizer's report after $cycles cycles:" >&2
  cat "$logs/cycles-$cycles.log" >&2
  exit 1
fi
