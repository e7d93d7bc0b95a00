"""The demo's claim, end to end: retrieval helps, the LM-supervised reranker helps more, and it beats
the same encoder without LM supervision; and its published figures, verified (``--verify``) against the
recipe's expected results (``configs/recipes/demo.expected.yaml``) within the tolerance of this machine's kind.

Runs ``python -m pipeline --config configs/recipes/demo.yaml`` (what ``scripts/demo.sh`` runs, in its own
process) on the demo's world less the dev and held-out texts and without the zero-shot row (reported by the
demo, not part of its claim): the same training data and the same 100 fine-tuning steps of the generic
pretrained MiniLM (fetched by ``scripts/setup.sh``; the test skips without it), evaluated on the 8 evaluation
articles. Training cannot be cut to fewer steps: at 40 steps on 1,000 examples the reranker was still behind
BM25 on its validation split (measured), and 50-step schedules captured 0 % (lr 5e-5) and 12 % (lr 1e-4) of
the BM25-to-oracle gap on the validation split against 32 % for 100 steps (measured); its steps were made
cheaper instead (4 candidates of 48 tokens, no dropout; docs/EXPERIMENTS.md), and it is still the suite's
slowest test (424-528 s in float32 on a 2-core AVX2-only CPU, about half of the test command there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.expected import dump, load
from ralm import models

ROOT = Path(__file__).resolve().parents[1]

#: The demo's rows less zero-shot (reported, not asserted).
CLAIM = ["none", "bm25", "cosine", "trained", "oracle"]

pytestmark = pytest.mark.skipif(not models.is_fetched("minilm-l6"),
                                reason="needs the MiniLM encoder: python -m ralm.models fetch minilm-l6 "
                                       "(scripts/setup.sh does it)")


@pytest.fixture(scope="module")
def ppl(tmp_path_factory) -> dict[str, dict[str, float]]:
    """Word-level perplexity per text and reranker from one demo pipeline run without dev and held-out texts."""
    tmp = tmp_path_factory.mktemp("demo")
    world = tmp / "world"
    proc = subprocess.run([sys.executable, "-m", "demo.world", "--config", str(ROOT / "configs" / "demo" / "world.yaml"),
                           "--dev_articles", "0", "--heldout_articles", "0", "--out", str(world)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recipe = yaml.safe_load((ROOT / "configs" / "recipes" / "demo.yaml").read_text())
    recipe["out"] = str(tmp / "run")
    recipe["texts"] = {"train": {"file": str(world / "train.txt")}, "report": {"eval": {"file": str(world / "eval.txt")}}}
    recipe["corpus"] = {"file": str(world / "corpus.txt")}
    recipe["eval"]["rerankers"] = CLAIM
    (tmp / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(tmp / "recipe.yaml")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ppl = {"run": tmp / "run", "recipe": tmp / "recipe.yaml",
           "eval": {name: json.loads((tmp / "run" / "ppl" / "eval" / name / "results.json").read_text())["ppl_word"]
                    for name in ("none", "bm25", "cosine", "predictive", "oracle")}}
    print("demo run, eval:", _table(ppl["eval"]))  # shown with pytest -s
    return ppl


def _claim_only(expected: dict) -> dict:
    """The expected results less what the test's run leaves out: the held-out text and the zero-shot row."""
    for m in expected["measurements"]:
        m["tables"] = [t | {"markdown": "\n".join(line for line in t["markdown"].splitlines()
                                                  if not line.startswith("| zero-shot |")) + "\n"}
                       for t in m["tables"] if t["where"] == "eval"]
    return expected


def _verify(ppl, expected: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "--config", str(ppl["recipe"]), "--out", str(out),
                           "--expected", str(expected), "--verify"], cwd=ROOT, capture_output=True, text=True)


def test_published_figures_verify(ppl, tmp_path):
    """Every published figure of the evaluation text (perplexity, change and interval against bm25 and cosine) is
    OK or OKISH on this machine's kind; one figure moved in a copy of the report fails, exit status 1."""
    expected = tmp_path / "demo.expected.yaml"
    expected.write_text(dump(_claim_only(load(ROOT / "configs" / "recipes" / "demo.expected.yaml"))))
    proc = _verify(ppl, expected, ppl["run"])
    print(proc.stdout)
    assert proc.returncode == 0 and " 0 FAIL" in proc.stdout and "the same kind" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("\nOK") >= 15, proc.stdout  # 5 rows' values, 4 + 4 changes against bm25 and cosine

    copy = tmp_path / "copy"
    shutil.copytree(ppl["run"] / "report", copy / "report")
    table = copy / "report" / "eval" / "vs-bm25" / "comparison.md"
    row = next(line for line in table.read_text().splitlines() if line.startswith("| predictive |"))
    word = row.split("|")[2].strip()
    table.write_text(table.read_text().replace(row, row.replace(f"| {word} |", f"| {float(word) * 1.05:.3f} |")))
    proc = _verify(ppl, expected, copy)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "predictive value" in failed[0] and "eval/vs-bm25" in failed[0], proc.stdout


def _table(ppl):
    return ", ".join(f"{k} {v:.3f}" for k, v in ppl.items())


def test_retrieval_helps(ppl):
    assert ppl["eval"]["none"] > ppl["eval"]["bm25"], _table(ppl["eval"])


def test_oracle_is_lowest(ppl):
    assert ppl["eval"]["oracle"] == min(ppl["eval"].values()), _table(ppl["eval"])


def test_predictive_beats_bm25(ppl):
    assert ppl["eval"]["none"] > ppl["eval"]["bm25"] > ppl["eval"]["predictive"], _table(ppl["eval"])


def test_lm_supervision_beats_the_same_encoder_untrained(ppl):
    assert ppl["eval"]["predictive"] < ppl["eval"]["cosine"], _table(ppl["eval"])
