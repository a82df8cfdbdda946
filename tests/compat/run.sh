#!/usr/bin/env bash
# The test suites against another PyTorch (the Makefile's `make test-compat
# TORCH=x.y.z` calls this after building): ctest and pytest of a build tree
# configured with that torch's Python, then the cross-version test, which
# loads the plugins of the default build (made with the default torch) into
# this tree's loader under the other torch.
#
#   tests/compat/run.sh <compat build tree> <default build tree> [pytest args...]
#
# Environment: PY (the compat venv's python).
set -uo pipefail
tree=$(realpath "${1:?compat build tree}")
default_build=$(realpath "${2:?default build tree}")
shift 2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${PY:?PY: the python of the compat venv}

"$repo/tests/link_package.sh" "$tree" || exit 2
export PYTHONPATH=$tree/python${PYTHONPATH:+:$PYTHONPATH}
found=$("$py" -c 'import torch, max_device; print(torch.__version__, max_device.__file__)') || exit 1
echo "torch and max_device: $found"
[[ $found == *" $tree/python/max_device/"* ]] || { echo "max_device is not imported from $tree/python" >&2; exit 1; }

rc=0
(cd "$tree" && ctest --output-on-failure -j "${CTEST_JOBS:-2}") || rc=1
cd "$repo"
MAXDEV_BUILD_DIR=$tree "$py" -m pytest -q -ra -p no:cacheprovider "${@:-tests/python}" || rc=1
MAXDEV_BUILD_DIR=$tree MAXDEV_PLUGINS_FROM=$default_build \
  "$py" -m pytest -q -ra -p no:cacheprovider tests/python/test_cross_version.py || rc=1
exit $rc
