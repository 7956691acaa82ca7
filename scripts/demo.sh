#!/usr/bin/env bash
# Install replaylint (the light base install: libcst only) and run it on the bundled example:
# the findings, the diff --fix would apply, and a clean re-check of a fixed copy.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
python -m pip install --quiet -e .

echo "\$ replaylint examples/"
replaylint examples/ || true
echo
echo "\$ replaylint --diff examples/"
replaylint --diff examples/ || true
echo
copy="$(mktemp -d)"
cp -r examples "$copy/"
echo "\$ replaylint --fix <copy of examples/> && replaylint <copy of examples/>"
replaylint --fix "$copy/examples" || true
replaylint "$copy/examples"
rm -rf "$copy"
