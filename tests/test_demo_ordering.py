"""The demo's claim, end to end on a smaller world: retrieval helps, the LM-supervised reranker helps
more, and it beats the same encoder without LM supervision.

Runs ``python -m demo.run`` (every stage the real CLI, in its own process) with ``configs/demo`` cut
down: fewer evaluation and held-out articles, fewer training examples and fewer fine-tuning steps of
the generic pretrained MiniLM (fetched by ``scripts/setup.sh``; the test skips without it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ralm import models

ROOT = Path(__file__).resolve().parents[1]

SMALLER = {
    "world.yaml": {"eval-articles": 4, "dev-articles": 0, "heldout-articles": 4},
    "build.yaml": {"examples": 1000, "shard_size": 250},
    "fit.yaml": {"trainer": {"max_steps": 40, "val_check_interval": 20}, "model": {"warmup_steps": 8}},
}

pytestmark = pytest.mark.skipif(not models.is_fetched("minilm-l6"),
                                reason="needs the MiniLM encoder: python -m ralm.models fetch minilm-l6 "
                                       "(scripts/setup.sh does it)")


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return base


@pytest.fixture(scope="module")
def ppl(tmp_path_factory) -> dict[str, dict[str, float]]:
    """Word-level perplexity per text and reranker from one smaller demo run."""
    tmp = tmp_path_factory.mktemp("demo")
    cfg = tmp / "configs"
    cfg.mkdir()
    for f in ("world.yaml", "build.yaml", "fit.yaml", "ppl.yaml"):
        c = yaml.safe_load((ROOT / "configs" / "demo" / f).read_text())
        (cfg / f).write_text(yaml.safe_dump(_merge(c, SMALLER.get(f, {}))))
    out = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "demo.run", "--out", str(out), "--config-dir", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ppl = json.loads((out / "summary.json").read_text())["ppl_word"]
    for text, p in ppl.items():
        print(f"smaller demo run, {text}:", _table(p))  # shown with pytest -s; the README quotes it
    return ppl


def _table(ppl):
    return ", ".join(f"{k} {v:.3f}" for k, v in ppl.items())


TEXTS = ["eval", "heldout"]


@pytest.mark.parametrize("text", TEXTS)
def test_retrieval_helps(ppl, text):
    assert ppl[text]["none"] > ppl[text]["bm25"], _table(ppl[text])


@pytest.mark.parametrize("text", TEXTS)
def test_zero_shot_beats_bm25(ppl, text):
    assert ppl[text]["zero-shot"] < ppl[text]["bm25"], _table(ppl[text])


@pytest.mark.parametrize("text", TEXTS)
def test_oracle_is_lowest(ppl, text):
    assert ppl[text]["oracle"] == min(ppl[text].values()), _table(ppl[text])


@pytest.mark.parametrize("text", TEXTS)
def test_predictive_beats_bm25(ppl, text):
    assert ppl[text]["none"] > ppl[text]["bm25"] > ppl[text]["predictive"], _table(ppl[text])


@pytest.mark.parametrize("text", TEXTS)
def test_lm_supervision_beats_the_same_encoder_untrained(ppl, text):
    assert ppl[text]["predictive"] < ppl[text]["cosine"], _table(ppl[text])
