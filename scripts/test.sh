#!/usr/bin/env bash
# Fresh machine -> installed project -> full offline test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
