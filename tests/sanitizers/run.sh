#!/usr/bin/env bash
# Runs the test suites of a sanitizer build tree (the Makefile's
# `make sanitize-asan` / `make sanitize-tsan` call this after building).
#
#   tests/sanitizers/run.sh <asan|tsan> <build tree> <cpp|python> [pytest args...]
#
# cpp     ctest in the tree. The test executables link the sanitizer runtime
#         themselves: nothing is preloaded.
# python  pytest on tests/python with the tree's sanitized _C module. The
#         tree's python/max_device is a directory of symlinks to the .py
#         files of python/max_device plus the sanitized libraries the build
#         put there (MAXDEV_PACKAGE_DIR), and PYTHONPATH puts it ahead of the
#         venv's .pth (which points at python/). Python and libtorch are not
#         instrumented, so the sanitizer runtime is LD_PRELOADed.
#
# Environment: PY (python, default .venv/bin/python), CTEST_JOBS (default 2).
set -euo pipefail

kind=${1:?asan|tsan}
tree=$(realpath "${2:?build tree}")
suite=${3:?cpp|python}
shift 3

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PY:-$repo/.venv/bin/python}
[[ $py = /* ]] || py=$repo/$py
cc=${CC:-gcc}

case $kind in
  asan)
    runtime=$($cc -print-file-name=libasan.so)
    # Leak detection stays on for the C++ tests (LSan suppressions: lsan.supp,
    # libtorch's and libstdc++'s process-lifetime allocations only). CPython's
    # allocator makes LeakSanitizer useless in the interpreter: off there.
    common_asan="halt_on_error=1:check_initialization_order=1"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp"
    if [[ $suite = cpp ]]; then
      # quarantine_size_mb=16 (default 256): the hot-swap stress test bounds
      # RSS and /proc/self/maps growth over 1,000 reloads and 10^5 calls; a
      # 256 MB quarantine of freed blocks alone grows RSS past its bound.
      # 16 MB still holds every block the other tests free.
      export ASAN_OPTIONS="$common_asan:detect_leaks=1:quarantine_size_mb=16"
      export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
    else
      export ASAN_OPTIONS="$common_asan:detect_leaks=0"
    fi
    ;;
  tsan)
    runtime=$($cc -print-file-name=libtsan.so)
    # halt_on_error=1: a report fails the test that caused it, with the
    # report in its captured output. Suppressions: tsan.supp (uninstrumented
    # libraries only; never loader/ code).
    # use_madv_dontdump=0: TSan marks the shadow of every newly mapped range
    # MADV_DONTDUMP, which splits its shadow mapping in two more VMAs per
    # plugin load; the hot-swap stress test bounds /proc/self/maps growth
    # over 1,000 reloads (only core dumps get bigger).
    # OMP_NUM_THREADS=1: libgomp hands work to its workers through futex
    # barriers TSan cannot see, so every CPU kernel that goes parallel reports
    # races inside libtorch (fbgemm, TensorIterator); no loader code runs on
    # OpenMP workers.
    export OMP_NUM_THREADS=1
    export TSAN_OPTIONS="halt_on_error=1:use_madv_dontdump=0:second_deadlock_stack=1:history_size=4:report_signal_unsafe=0:suppressions=$here/tsan.supp"
    ;;
  *) echo "unknown sanitizer '$kind' (asan|tsan)" >&2; exit 2 ;;
esac
[[ -f $runtime ]] || { echo "no sanitizer runtime at '$runtime'" >&2; exit 2; }
# libstdc++ too: python does not link it, and a runtime preloaded alone finds
# no __cxa_throw to wrap ("real___cxa_throw != 0" CHECK failure at the first
# C++ exception).
preload="$runtime $($cc -print-file-name=libstdc++.so)"

case $suite in
  cpp)
    cd "$tree"
    exec ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
    ;;
  python)
    pkg=$tree/python/max_device
    "$repo/tests/link_package.sh" "$tree"
    export PYTHONPATH=$tree/python${PYTHONPATH:+:$PYTHONPATH}
    export MAXDEV_BUILD_DIR=$tree
    # The sanitized package, not python/'s, or the run means nothing.
    found=$(LD_PRELOAD=$preload "$py" -c 'import max_device, max_device._C as c; print(max_device.__file__); print(c.__file__)')
    echo "$found" | sed 's/^/max_device from: /'
    if [[ $(echo "$found" | grep -c "^$pkg/") -ne 2 ]]; then
      echo "max_device is not imported from $pkg" >&2; exit 1
    fi
    # pytest captures fd 2 and loses it when a report ends the process: the
    # sanitizers write their reports to files instead, printed below.
    # handle_segv=0: tests/python/test_validation.py checks that a plugin
    # crashing in an isolated child is reported with its signal (SIGSEGV);
    # the sanitizer's own SEGV handler would turn it into exit code 1/66.
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_segv=0
    export TSAN_OPTIONS=${TSAN_OPTIONS:+$TSAN_OPTIONS:}handle_segv=0
    logs=$tree/sanitizer-logs
    rm -rf "$logs" && mkdir -p "$logs"
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$logs/asan
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}log_path=$logs/ubsan
    export TSAN_OPTIONS=${TSAN_OPTIONS:+$TSAN_OPTIONS:}log_path=$logs/tsan
    cd "$repo"
    rc=0
    LD_PRELOAD=$preload "$py" -m pytest -q -ra -p no:cacheprovider "${@:-tests/python}" || rc=$?
    if [[ -n $(ls -A "$logs") ]]; then
      for f in "$logs"/*; do echo "=== $f"; cat "$f"; done
      echo "sanitizer reports: $logs" >&2
      [[ $rc -ne 0 ]] || rc=1
    fi
    exit $rc
    ;;
  *) echo "unknown suite '$suite' (cpp|python)" >&2; exit 2 ;;
esac
