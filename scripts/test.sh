#!/usr/bin/env bash
# Install everything and run every check: ruff, mypy and the test suite (CPU; GPU tests skip
# without CUDA). Extra arguments go to pytest, e.g. `scripts/test.sh -k sarif`.
# TORCH_SPEC picks the torch build (default: the CPU wheel torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install --quiet -e ".[test,dev,guards,kernels,lsp]"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
export HELION_INTERPRET="${HELION_INTERPRET:-1}"
python -m pytest -q "$@"
