"""The learning curve of a recipe whose fits differ in how much training data they read (``--data.examples``):
for each text, word perplexity and the share of the BM25-to-oracle gap closed against the examples read, every
seed and their mean, with the rows that read no training data (the untrained start, bm25, zero-shot, oracle)
as references. Read from the evaluations' ``results.json``; the mean of seeds and the gap are
:mod:`eval.compare`'s, whose tables hold the intervals.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

from eval.compare import gap_closed, mean_of_seeds
from pipeline.plan import Recipe

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

#: Rows drawn as horizontal references, when evaluated.
REFERENCES = ("bm25", "zero-shot", "oracle")


def _ppl(r: Recipe, text: str, row: str) -> float | None:
    f = r.root / "ppl" / text / row / "results.json"
    return json.loads(f.read_text())["ppl_word"] if f.is_file() else None


def points(r: Recipe, text: str) -> list[tuple[int, str, list[float]]]:
    """``(examples read, fit name, each finished seed's word perplexity)`` of every fit, by examples; empty when
    the fits do not differ in their data (no curve to draw)."""
    manifest = r.root / "data" / "manifest.json"
    whole = json.loads(manifest.read_text())["examples"] if manifest.is_file() else None
    out = []
    for f in r.fits:
        n = f.set.get("data.examples", whole)
        ppls = [p for p in (_ppl(r, text, row) for row in f.rows()) if p is not None]
        if n is not None and ppls:
            out.append((int(n), f.name, ppls))
    return sorted(out) if len({n for n, _, _ in out}) > 1 else []


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
