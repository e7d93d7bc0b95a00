"""Expected results as data: every shipped recipe has a readable expected file, the documents print its tables
(``pipeline.published --check``), and ``--verify`` grades figures OK / OKISH / FAIL with the right tolerance."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import expected as ex
from pipeline.published import rewrite
from ralm.settings import InputError

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "configs" / "recipes").glob("*.yaml") if not p.name.endswith(".expected.yaml"))

TABLE = """> **Only 8 articles**: a note above the table.

| run | word ppl | token ppl | vs none | vs bm25 [95% CI] | p (bootstrap) | BM25 first chosen |
|---|---|---|---|---|---|---|
| none | 6.181 | 3.798 | +0.0% | +27.7% [+20.6, +34.1] | <1e-4 | - |
| bm25 | 4.842 | 3.176 | -21.7% | - | - | 100% |
| predictive | 4.708 | 3.111 | -23.8% | -2.8% [-6.8, +1.7] | 0.099 | 59% |
| **predictive, mean of 2 seeds** | 4.700 | 3.110 | -23.9% | **−2.9 % [−6.9, +1.6]** | 0.099 | 59% |

819 strides, 3525 scored tokens, 2583 words (spaces), 8 articles.
"""


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_names_an_expected_file_that_loads(recipe):
    path = yaml.safe_load(recipe.read_text()).get("expected")
    assert path, f"{recipe.name}: no 'expected:' (its expected results; an empty list of measurements if none yet)"
    data = ex.load(ROOT / path)
    assert data["recipe"] == f"configs/recipes/{recipe.name}"
    for m in data["measurements"]:
        for t in m["tables"]:  # a checked table has figures to check
            assert not t.get("where") or ex.figures(t["markdown"], t.get("names")), (path, t["id"])


def test_the_documents_print_the_expected_tables():
    proc = subprocess.run([sys.executable, "-m", "pipeline.published", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_published_rewrites_a_stale_block(tmp_path):
    exp = tmp_path / "x.expected.yaml"
    exp.write_text(ex.dump({"recipe": "configs/recipes/x.yaml", "measurements": [_measurement(TABLE)]}))
    doc = f"prose\n\n<!-- expected {exp.name} m eval/vs-bm25 -->\nold numbers\n<!-- /expected -->\nmore prose\n"
    new, changed = rewrite(doc, tmp_path)
    assert changed == [f"{exp.name} m eval/vs-bm25"]
    block = f"<!-- expected {exp.name} m eval/vs-bm25 -->\n\n{TABLE.strip()}\n\n<!-- /expected -->"
    assert new == f"prose\n\n{block}\nmore prose\n"
    assert rewrite(new, tmp_path) == (new, [])


def test_figures_read_back_from_a_table():
    f = ex.figures(TABLE)
    assert f[("none", "value")] == (6.181,) and f[("predictive", "vs", "bm25")] == (-2.8, -6.8, 1.7)
    assert f[("predictive, mean of 2 seeds", "vs", "bm25")] == (-2.9, -6.9, 1.6)  # bold, U+2212, spaces
    assert ("bm25", "vs", "bm25") not in f and ("none", "vs", "none") not in f
    named = ex.figures(TABLE, {"predictive": "shared-seed0", "bm25": "BM25"})
    assert named[("shared-seed0", "vs", "BM25")] == (-2.8, -6.8, 1.7)
    judge = ex.figures("| reranker | mean -log p(y given chosen d) | vs BM25's first [95% CI] |\n|---|---|---|\n"
                       "| n3125-seed0 | 100.511 | -0.251 [-0.476, -0.022] |\n")
    assert judge == {("n3125-seed0", "value"): (100.511,),
                     ("n3125-seed0", "vs", "BM25's first"): (-0.251, -0.476, -0.022)}
    assert ex.figures("| text | bm25 |\n|---|---|\n| report | 57.066 |\n") == {}  # rows are texts, not runs
    # a table against none: its interval column is a baseline's, the plain "vs none" column is not
    vs_none = ex.figures("| run | word ppl | vs none | vs none-every_row [95% CI] |\n|---|---|---|---|\n"
                         "| bm25-every_row | 41.978 | -4.4% | -4.4% [-10.8, -0.4] |\n",
                         {"none-every_row": "none", "bm25-every_row": "bm25"})
    assert vs_none == {("bm25", "value"): (41.978,), ("bm25", "vs", "none"): (-4.4, -10.8, -0.4)}


def _measurement(md: str) -> dict:
    return {"name": "m", "command": "python -m pipeline --config configs/recipes/x.yaml", "precision": "float32",
            "device": "CPU with native bf16",
            "tolerance": {"same": {"value": 0.0002, "change": 0.1, "okish_value": 0.01, "okish_change": 1.0},
                          "other": {"value": 0.01, "change": 0.6, "okish_value": 0.03, "okish_change": 2.0}},
            "tables": [{"id": "eval/vs-bm25", "where": "eval", "markdown": md}]}


def _run(tmp_path: Path, table: str) -> Path:
    out = tmp_path / "run"
    (out / "report" / "eval" / "vs-bm25").mkdir(parents=True, exist_ok=True)
    (out / "report" / "eval" / "vs-bm25" / "comparison.md").write_text(table)
    return out


def _grades(data, out, kind) -> dict[str, str]:
    return {line.what: line.grade for line in ex.verify(data, out, kind)[1]}


def test_verify_grades_each_figure(tmp_path):
    data = {"recipe": "configs/recipes/x.yaml", "measurements": [_measurement(TABLE)]}
    f32 = ex.kind("float32", "CPU with native bf16")
    assert set(_grades(data, _run(tmp_path, TABLE), f32).values()) == {"OK"}
    moved = (TABLE.replace("| predictive | 4.708 |", "| predictive | 4.750 |")      # +0.9 %: OKISH
                  .replace("| none | 6.181 |", "| none | 6.500 |")                  # +5 %: FAIL
                  .replace("| bm25 | 4.842 |", "| bm25 | 4.700 |")                  # -2.9 %: better, OKISH
                  .replace("-2.8% [-6.8, +1.7]", "-2.8% [-6.9, +1.7]"))            # 0.1 points: OK
    g = _grades(data, _run(tmp_path, moved), f32)
    assert (g["predictive value"], g["none value"], g["bm25 value"], g["predictive vs bm25"]) == (
        "OKISH", "FAIL", "OKISH", "OK")
    # a bf16 run is another kind: the looser tolerances (1 % OK) and a header that says so
    head, lines = ex.verify(data, _run(tmp_path, moved), ex.kind("bfloat16", "CPU with native bf16"))
    assert "another kind" in head[1] and {x.what: x.grade for x in lines}["predictive value"] == "OK"
    missing = TABLE.replace("| predictive | 4.708 | 3.111 | -23.8% | -2.8% [-6.8, +1.7] | 0.099 | 59% |\n", "")
    g = _grades(data, _run(tmp_path, missing), f32)
    assert g["predictive value"] == g["predictive vs bm25"] == "FAIL"


def test_expect_records_a_run_that_then_verifies(tmp_path):
    out = _run(tmp_path, TABLE)
    m = ex.measure(out, ["eval"], "bfloat16", "CPU with native bf16", "python -m pipeline --config r.yaml", "a CPU")
    target = tmp_path / "r.expected.yaml"
    ex.record(target, "r.yaml", m)
    ex.record(target, "r.yaml", m)  # the same kind again: replaced, not added
    data = ex.load(target)
    assert len(data["measurements"]) == 1 and [t["id"] for t in data["measurements"][0]["tables"]] == ["eval/vs-bm25"]
    assert set(_grades(data, out, ex.kind("bfloat16", "CPU with native bf16")).values()) == {"OK"}


def test_a_bad_expected_file_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "bad.expected.yaml"
    bad.write_text("recipe: r.yaml\nmeasurements: [{name: m, command: c, precision: float32, device: CPU}]\n")
    with pytest.raises(InputError, match=f"{bad}.*device 'CPU'|{bad}.*missing tolerance, tables"):
        ex.load(bad)
    bad.write_text("measurements: [\n")
    with pytest.raises(InputError, match="not YAML"):
        ex.load(bad)
    with pytest.raises(InputError, match="no such file.*--expect"):
        ex.load(tmp_path / "none.yaml")
