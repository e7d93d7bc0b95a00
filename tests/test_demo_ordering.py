"""The demo's claim, end to end on a smaller world: retrieval helps, LM-aware reranking helps more.

Runs ``python -m demo.run`` (every stage the real CLI, in its own process) with ``configs/demo`` cut
down: fewer evaluation articles, fewer training examples and fewer fine-tuning steps. The committed
demo LM and pretrained encoder are used as they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

SMALLER = {
    "world.yaml": {"eval-articles": 4},
    "build.yaml": {"examples": 1000, "shard_size": 250},
    "fit.yaml": {"trainer": {"max_steps": 120, "val_check_interval": 60}},
}


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return base


@pytest.fixture(scope="module")
def ppl(tmp_path_factory) -> dict[str, float]:
    """Word-level perplexity per reranker from one smaller demo run."""
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
    print("smaller demo run:", _table(ppl))  # shown with pytest -s; the README quotes it
    return ppl


def _table(ppl):
    return ", ".join(f"{k} {v:.3f}" for k, v in ppl.items())


def test_retrieval_helps(ppl):
    assert ppl["none"] > ppl["bm25"], _table(ppl)


def test_zero_shot_beats_bm25(ppl):
    assert ppl["zero-shot"] < ppl["bm25"], _table(ppl)


def test_oracle_is_lowest(ppl):
    assert ppl["oracle"] == min(ppl.values()), _table(ppl)


def test_predictive_beats_no_retrieval(ppl):
    assert ppl["predictive"] < ppl["none"], _table(ppl)


def test_predictive_beats_bm25(ppl):
    assert ppl["predictive"] < ppl["bm25"], _table(ppl)
