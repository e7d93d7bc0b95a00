#!/usr/bin/env bash
# Fresh machine -> installed project (and the real models) -> the full offline test suite, in one
# pytest process. The JVM never runs inside it: BM25 searches go through ralm/search_process.py, and
# tests/conftest.py fails the session if anything started a JVM in the pytest process.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache bytecode: see scripts/setup.sh
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
