# Sourced by the scripts: create (once) and activate the project's virtual environment.
# REPLAYLINT_VENV picks its folder (default: .venv at the repo root).
venv="${REPLAYLINT_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
