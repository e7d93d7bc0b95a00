#!/usr/bin/env bash
# Fresh machine -> installed project -> the whole pipeline offline on the synthetic demo world.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache bytecode: see scripts/setup.sh
bash scripts/setup.sh minilm-l6  # the demo's one pretrained model (SmolLM2 is for the real-text recipes and tests)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m demo.run "$@"
