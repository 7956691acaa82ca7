#!/usr/bin/env bash
# Install everything and run every check: ruff, mypy and the test suite (CPU; GPU tests skip
# without CUDA), spread over the CPUs (pytest-xdist). Extra arguments go to pytest, e.g.
# `scripts/test.sh -k sarif`, or `scripts/test.sh -n 0` for one process.
# torch comes first, as `pip install $TORCH_SPEC` (default: torch==2.13.0). That pin is the CPU
# build only where the index or a local wheel house serves a CPU wheel for it (as on this
# project's CI machines); from PyPI on Linux x86_64 it is the CUDA build. To choose, e.g.:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
read -ra torch_spec <<< "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install --quiet "${torch_spec[@]}"
python -m pip install --quiet -e ".[test,dev,guards,kernels,lsp]"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
export HELION_INTERPRET="${HELION_INTERPRET:-1}"
python -m pytest -q -n auto "$@"
