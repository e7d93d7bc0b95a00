"""The learning curve of a recipe whose fits differ in how much training data they read (``--data.examples``):
for each text, word perplexity and the share of the BM25-to-oracle gap closed against the examples read, every
seed and their mean, with the rows that read no training data (the untrained start, bm25, zero-shot, oracle)
as references; and the same on the held-out judge (mean −log p(y | chosen d) of held-out examples), where the
recipe has one. Read from the evaluations' ``results.json`` and the judge's ``judge.json``; the mean of seeds
and the gap are :mod:`eval.compare`'s, whose tables (and the judge's) hold the intervals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np

from eval.compare import gap_closed, mean_of_seeds
from pipeline.plan import Recipe

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

#: Rows drawn as horizontal references, when evaluated.
REFERENCES = ("bm25", "zero-shot", "oracle")


def _ppl(r: Recipe, text: str, row: str) -> float | None:
    f = r.root / "ppl" / text / row / "results.json"
    return json.loads(f.read_text())["ppl_word"] if f.is_file() else None


def _points(r: Recipe, value: Callable[[str], float | None]) -> list[tuple[int, str, list[float]]]:
    """``(examples read, fit name, each finished seed's value)`` of every fit, by examples; empty when the fits
    do not differ in their data (no curve to draw)."""
    manifest = r.root / "data" / "manifest.json"
    whole = json.loads(manifest.read_text())["examples"] if manifest.is_file() else None
    out = []
    for f in r.fits:
        n = f.set.get("data.examples", whole)
        got = [v for v in (value(row) for row in f.rows()) if v is not None]
        if n is not None and got:
            out.append((int(n), f.name, got))
    return sorted(out) if len({n for n, _, _ in out}) > 1 else []


def points(r: Recipe, text: str) -> list[tuple[int, str, list[float]]]:
    """Each fit's examples read and its seeds' word perplexities on ``text``."""
    return _points(r, lambda row: _ppl(r, text, row))


def references(r: Recipe, text: str) -> dict[str, float]:
    """Word perplexity of the rows that read no training data: the untrained starts, bm25, zero-shot, oracle."""
    names = [f"{f.name}-untrained" for f in r.fits if f.untrained] + list(REFERENCES)
    return {n: p for n in names if (p := _ppl(r, text, n)) is not None}


def table(r: Recipe, text: str) -> list[str]:
    """The curve as markdown lines (none when there is no curve)."""
    pts = points(r, text)
    if not pts:
        return []
    refs = references(r, text)
    bm25, oracle = refs.get("bm25"), refs.get("oracle")
    lines = ["| examples | fit | word ppl of each seed | mean | vs bm25 | gap bm25 → oracle closed |",
             "|---|---|---|---|---|---|"]
    for n, name, ppls in pts:
        mean = mean_of_seeds(ppls)
        share = gap_closed(bm25, oracle, mean) if bm25 and oracle else None
        lines.append(f"| {n:,} | {name} | {', '.join(f'{p:.3f}' for p in ppls)} | {mean:.3f} | "
                     + (f"{100 * (mean / bm25 - 1):+.1f}%" if bm25 else "-") + " | "
                     + (f"{100 * share:.0f}%" if share is not None else "-") + " |")
    lines += ["", "Without training data: " + ", ".join(f"{k} {v:.3f}" for k, v in refs.items()) + ". Mean: geometric "
              "mean of the seeds' perplexities; intervals against each baseline in the tables below.", ""]
    return lines


def judged(r: Recipe) -> dict | None:
    """The judge's numbers (``OUT/judge/judge.json``, written by reranking.heldout), if it ran."""
    f = r.root / "judge" / "judge.json"
    return json.loads(f.read_text()) if f.is_file() else None


def judge_points(r: Recipe) -> list[tuple[int, str, list[float]]]:
    """Each fit's examples read and its seeds' mean −log p(y | chosen d) on the judge's examples."""
    j = judged(r)
    return _points(r, lambda row: j["rows"][row]["nll"] if row in j["rows"] else None) if j else []


def _gap(j: dict, nll: float) -> float:
    return (j["bm25_first_nll"] - nll) / (j["bm25_first_nll"] - j["oracle_nll"])


def judge_table(r: Recipe) -> list[str]:
    """The curve on the judge as markdown lines (none without a judge or a curve)."""
    pts, j = judge_points(r), judged(r)
    if not pts:
        return []
    lines = ["| examples | fit | -log p(y given chosen d) of each seed | mean | vs BM25's first | gap captured |",
             "|---|---|---|---|---|---|"]
    for n, name, nlls in pts:
        mean = float(np.mean(nlls))
        lines.append(f"| {n:,} | {name} | {', '.join(f'{v:.3f}' for v in nlls)} | {mean:.3f} | "
                     f"{mean - j['bm25_first_nll']:+.3f} | {100 * _gap(j, mean):.1f}% |")
    refs = [f"{n} {v['nll']:.3f} ({100 * v['gap_captured']:.1f}%)" for n, v in j["rows"].items()
            if n.endswith("-untrained") or n == "cosine"]
    lines += ["", f"{j['examples']:,} held-out examples: BM25's first {j['bm25_first_nll']:.3f}, oracle "
              f"{j['oracle_nll']:.3f} nats per target; without training data: {', '.join(refs) or '-'}. Mean: "
              "arithmetic mean of the seeds; intervals in the judge's table below.", ""]
    return lines


def judge_plot(r: Recipe, path: Path) -> bool:
    """Examples (log axis) against the share of the judge's BM25-to-oracle gap captured; False when there is
    no curve."""
    pts, j = judge_points(r), judged(r)
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for n, _, nlls in pts:
        ax.scatter([n] * len(nlls), [100 * _gap(j, v) for v in nlls], s=14, color="C0", alpha=0.6)
    ax.plot([n for n, _, _ in pts], [100 * _gap(j, float(np.mean(v))) for _, _, v in pts], "-o", color="C0",
            label="trained (mean of seeds)")
    refs = [(n, v) for n, v in j["rows"].items() if n.endswith("-untrained") or n == "cosine"]
    for i, (name, v) in enumerate(refs):
        ax.axhline(100 * v["gap_captured"], ls="--", lw=1, color=f"C{i + 1}", label=name)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(xscale="log", xlabel="LM-scored training examples read",
           ylabel="% of the BM25-first → oracle gap captured", title="the held-out judge: the learning curve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return True


def plot(r: Recipe, text: str, path: Path) -> bool:
    """Examples (log axis) against word perplexity and gap closed; False when there is no curve."""
    pts = points(r, text)
    if not pts:
        return False
    refs = references(r, text)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [n for n, _, _ in pts]
    for n, _, ppls in pts:
        a.scatter([n] * len(ppls), ppls, s=14, color="C0", alpha=0.6)
    a.plot(xs, [mean_of_seeds(p) for _, _, p in pts], "-o", color="C0", label="trained (mean of seeds)")
    for i, (name, v) in enumerate(refs.items()):
        a.axhline(v, ls="--", lw=1, color=f"C{i + 1}", label=name)
    a.set(xscale="log", xlabel="LM-scored training examples read", ylabel="word-level perplexity",
          title=f"{text}: the learning curve")
    a.legend(fontsize=8)
    if "bm25" in refs and "oracle" in refs:
        for n, _, ppls in pts:
            b.scatter([n] * len(ppls), [100 * gap_closed(refs["bm25"], refs["oracle"], p) for p in ppls], s=14,
                      color="C0", alpha=0.6)
        b.plot(xs, [100 * gap_closed(refs["bm25"], refs["oracle"], mean_of_seeds(p)) for _, _, p in pts], "-o")
        for i, (name, v) in enumerate(refs.items()):
            if name not in ("bm25", "oracle"):
                b.axhline(100 * gap_closed(refs["bm25"], refs["oracle"], v), ls="--", lw=1, color=f"C{i + 1}",
                          label=name)
        b.axhline(0, color="grey", lw=0.6)
        b.set(xscale="log", xlabel="LM-scored training examples read", ylabel="% of the bm25 → oracle gap closed")
        b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return True
