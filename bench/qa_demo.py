"""Open-domain QA on the demo world (issue #23): SmolLM2-135M-Instruct answering questions about the
world's people with one passage chosen by each reranker, and the paired differences against BM25.

    python bench/qa_demo.py                                   # none, bm25, oracle, zero-shot, cosine (~1 h on 2 cores)
    python bench/qa_demo.py --rerankers bm25,PATH/TO/EXPORT   # add a trained reranker's row

Every number comes from the real commands (``demo.world`` with ``configs/demo/world.yaml``, ``ralm.corpus``,
``demo.questions``, ``eval.qa``) run as subprocesses; each row is skipped when its ``results.json`` exists, so a
rerun continues where it stopped. The world is fictional: without a passage the LM cannot know an answer.
Paired comparison per question (the same 200 questions in every row): how many questions one row answers
and the other does not, and a 95 % bootstrap interval (10,000 resamples of the questions) of the
difference in answer containment.

Needs ``python -m ralm.models fetch smollm2-135m minilm-l6``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
METRICS = (("em", "exact match"), ("f1", "F1"), ("contains", "answer contained"))


def run(args: list[str]) -> None:
    print("$ python " + " ".join(args), flush=True)
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)


def prepare(out: Path) -> Path:
    """The demo's world, its Lucene index and 200 questions about the evaluation texts' people."""
    world = out / "world"
    if not (world / "people.json").exists():
        run(["-m", "demo.world", "--config", "configs/demo/world.yaml", "--out", str(world)])
    if not (out / "corpus" / "index").exists():
        run(["-m", "ralm.corpus", "--text.file", str(world / "corpus.txt"), "--out", str(out / "corpus")])
    questions = out / "eval.jsonl"
    if not questions.exists():
        run(["-m", "demo.questions", "--world", str(world), "--out", str(questions), "--split", "eval"])
    return questions


def row(out: Path, questions: Path, reranker: str, k: int) -> Path:
    name = Path(reranker).name if Path(reranker).exists() else reranker
    d = out / "rows" / name
    if not (d / "results.json").exists():
        extra = ["--ranker.model", "minilm-l6"] if reranker == "cosine" else []
        run(["-m", "eval.qa", "--questions", str(questions), "--model", "smollm2-135m", "--retrieval.index",
             str(out / "corpus" / "index"), "--retrieval.k", str(k), "--reranker", reranker, *extra,
             "--output_dir", str(d)])
    return d


def titles(out: Path) -> dict[str, str]:
    """Passage id -> title, read back as retrieval reads it."""
    from ralm.corpus import read_jsonl_passages
    from ralm.retrieval import parse_contents

    return {docid: parse_contents(contents)[0] for docid, contents in read_jsonl_passages(out / "corpus" / "jsonl")}


def per_question(d: Path, questions: Path, title: dict[str, str]) -> dict[str, np.ndarray]:
    """Each metric per question, and whether the passage given was the asked person's own."""
    from ralm.open_qa import contains_answer, exact_match, f1

    rows = [json.loads(line) for line in (d / "predictions.jsonl").read_text().splitlines()]
    asked = [json.loads(line)["person"] for line in questions.read_text().splitlines()]
    score = {"em": exact_match, "f1": f1, "contains": contains_answer}  # recomputed: rows of any version agree
    out = {m: np.array([score[m](r["prediction"], r["answers"]) for r in rows]) for m, _ in METRICS}
    out["own"] = np.array([title.get(r["passage"]) == who for r, who in zip(rows, asked)], dtype=float)
    return out


def table(rows: dict[str, dict[str, np.ndarray]], baseline: str, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    base = rows[baseline]["contains"]
    idx = rng.integers(0, len(base), size=(10_000, len(base)))
    lines = ["| reranker | " + " | ".join(n for _, n in METRICS) + f" | contained vs {baseline} [95% CI] | "
             f"questions won / lost vs {baseline} | asked person's own passage |",
             "|---|" + "---|" * (len(METRICS) + 3)]
    for name, r in rows.items():
        diff = r["contains"] - base
        lo, hi = np.percentile(diff[idx].mean(axis=1), [2.5, 97.5])
        cells = " | ".join(f"{r[m].mean():.3f}" for m, _ in METRICS)
        vs = "-" if name == baseline else f"{diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"
        won = "-" if name == baseline else f"{int((diff > 0).sum())} / {int((diff < 0).sum())}"
        own = "-" if name == "none" else f"{r['own'].mean():.1%}"
        lines.append(f"| {name} | {cells} | {vs} | {won} | {own} |")
    return "\n".join(lines) + f"\n\n{len(base)} questions; SmolLM2-135M-Instruct, greedy, one passage of BM25's top k."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "qa"), help="world, index, questions, rows, table")
    ap.add_argument("--rerankers", default="none,bm25,oracle,zero-shot,cosine", help="rows, comma-separated")
    ap.add_argument("--k", type=int, default=8, help="BM25 candidates per question")
    a = ap.parse_args(argv)
    out = Path(a.out)
    questions = prepare(out)
    dirs = {r: row(out, questions, r, a.k) for r in a.rerankers.split(",")}
    title = titles(out)
    rows = {d.name: per_question(d, questions, title) for d in dirs.values()}
    text = table(rows, "bm25" if "bm25" in rows else next(iter(rows)))
    (out / "table.md").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
