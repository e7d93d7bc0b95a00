#!/usr/bin/env bash
# Fresh machine -> installed project -> the whole pipeline offline on the synthetic demo world
# (configs/recipes/demo.yaml; arguments go to the pipeline, e.g. --precision float32 or --print_plan).
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache bytecode: see scripts/setup.sh
bash scripts/setup.sh minilm-l6  # the demo's one pretrained model (SmolLM2 is for the real-text recipes and tests)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m demo.world --config configs/demo/world.yaml --out runs/demo/world
exec .venv/bin/python -m pipeline --config configs/recipes/demo.yaml "$@"
