#!/usr/bin/env bash
# The linter against the oldest versions of its base dependencies that pyproject.toml admits:
# every `name>=X` of [project] dependencies is installed as `name==X` in a fresh virtual
# environment (no torch, no helion), then the linter's tests run. Extra arguments go to pytest.
# MIN_DEPS_VENV picks the environment's folder (default: a new temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MIN_DEPS_VENV:-$(mktemp -d)/venv}"
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install --quiet --upgrade pip

# `libcst>=1.5` -> `libcst==1.5`; markers are kept, so tomli is pinned only where it applies.
mapfile -t pins < <(python scripts/min_versions.py pyproject.toml)
echo "== minimum versions: ${pins[*]}"
python -m pip install --quiet "${pins[@]}"
python -m pip install --quiet --no-deps -e .
# Test tools at any version; they must not raise the pins above (pip check catches it).
python -m pip install --quiet "pytest>=8" "hypothesis>=6.100" "hypothesmith>=0.3.3" "jsonschema>=4.20" \
    "${pins[@]}"
python -m pip check
python -m pip list --format=freeze | grep -iE '^(libcst|typing.extensions|tomli)=' || true

echo "== pytest (tests/lint, minimum versions)"
python -m pytest -q -p no:cacheprovider tests/lint "$@"
