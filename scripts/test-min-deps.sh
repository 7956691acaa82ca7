#!/usr/bin/env bash
# The base install at its oldest: in a fresh virtual environment, every `name>=X` of
# [project] dependencies is installed as `name==X` (no torch, no helion), then
#   1. the built wheel is installed into it and run on examples/ as a user would run it, and
#      `import replaylint.kernels` must name the extra to install;
#   2. the linter's tests run against those versions (extra arguments go to pytest).
# MIN_DEPS_VENV picks the environment's folder (default: a new temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
venv="${MIN_DEPS_VENV:-$scratch/venv}"
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install --quiet --upgrade pip

mapfile -t pins < <(python scripts/min_versions.py pyproject.toml)
echo "== minimum versions: ${pins[*]}"
python -m pip install --quiet "${pins[@]}"

echo "== the wheel, base install, on examples/"
python -m pip wheel --quiet --no-deps --wheel-dir "$scratch/dist" .
python - "$scratch"/dist/replaylint-*.whl <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "LICENSE not in the wheel"
assert "replaylint/py.typed" in names and "replaylint/server/protocol.py" in names, names
assert not any(n.startswith("tests/") for n in names), "tests are in the wheel"
print(f"wheel: {len(names)} files, LICENSE and py.typed included, no tests")
PY
python -m pip install --quiet "$scratch"/dist/replaylint-*.whl "${pins[@]}"
python -m pip check
(
    cd "$scratch"  # not the checkout: the installed wheel must be what runs
    cp -r "$OLDPWD/examples" .
    set +e
    replaylint --no-cache --output-format concise examples > findings.txt
    status=$?
    set -e
    cat findings.txt
    [ "$status" -eq 1 ] || { echo "expected exit 1 (findings), got $status"; exit 1; }
    grep -q "RL001" findings.txt
    replaylint --fix --no-cache examples > /dev/null || true
    replaylint --no-cache examples
    message="$(python -c 'import replaylint.kernels' 2>&1 || true)"
    echo "$message" | tail -1
    echo "$message" | grep -qF "pip install 'replaylint[kernels]'"
    python -c 'import replaylint, sys; assert "site-packages" in replaylint.__file__, replaylint.__file__'
)

echo "== pytest (tests/lint, minimum versions)"
# Test tools at any version, with the pins held (pip check catches a conflict).
python -m pip install --quiet "pytest>=8" "hypothesis>=6.100" "hypothesmith>=0.3.3" \
    "jsonschema>=4.20" "junitparser>=3.1" "pytest-xdist>=3.5" "${pins[@]}"
python -m pip check
python -m pip list --format=freeze | grep -iE '^(libcst|typing.extensions|tomli)=' || true
# pytest-asyncio (for the language-server tests) is not installed here: its ini key is unknown.
python -m pytest -q -n auto -p no:cacheprovider -W "ignore::pytest.PytestConfigWarning" tests/lint "$@"
