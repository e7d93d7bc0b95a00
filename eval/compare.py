"""``python -m eval.compare RUN_DIR...``: several ``eval.ppl`` runs of one text side by side.

Prints one Markdown table (word- and token-level perplexity, relative change against the ``none`` and
``bm25`` runs when present, the share of strides that took BM25's first hit, and the number of strides
whose NLL went down or up against ``bm25``) and writes a plot: each run's per-stride NLL gain over the
first run given (cumulative, along the text) and the perplexities. Runs must be complete and of the
same text and windows; anything else is refused with the directory named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ralm.settings import InputError


def load_run(d: Path) -> dict:
    from eval.outputs import read_complete

    res = read_complete(d)
    if res is None:
        raise InputError(f"{d} holds no complete eval.ppl run (results.json missing or its files changed); "
                         "rerun eval.ppl there to finish it")
    import pyarrow.parquet as pq

    t = pq.read_table(d / "strides.parquet", columns=["stride", "nll", "n_tokens", "chosen_rank"])
    return {"dir": d, "results": res, "nll": t.column("nll").to_numpy(), "rank": t.column("chosen_rank").to_numpy()}


def _label(run: dict) -> str:
    """A built-in reranker by its name; a trained one (a path) by the run directory, which the user named."""
    name = run["results"]["reranker"]
    return Path(run["dir"]).name if "/" in name or len(name) > 24 else name


def table(runs: list[dict]) -> str:
    by = {r["results"]["reranker"]: r for r in runs}
    base = {k: by[k]["results"]["ppl_word"] for k in ("none", "bm25") if k in by}
    head = ["run", "word ppl", "token ppl"] + [f"vs {k}" for k in base] + ["BM25 first chosen", "strides better / worse than bm25"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        res = r["results"]
        row = [_label(r), f"{res['ppl_word']:.3f}", f"{res['ppl_token']:.3f}"]
        row += [f"{100 * (res['ppl_word'] / v - 1):+.1f}%" for v in base.values()]
        with_doc = r["rank"] >= 0
        row.append(f"{100 * (r['rank'][with_doc] == 0).mean():.0f}%" if with_doc.any() else "-")
        if "bm25" in by:
            d = r["nll"] - by["bm25"]["nll"]
            row.append(f"{int((d < -1e-6).sum())} / {int((d > 1e-6).sum())}")
        else:
            row.append("-")
        lines.append("| " + " | ".join(row) + " |")
    n = runs[0]["results"]
    lines.append(f"\n{n['n_strides']} strides, {n['n_scored_tokens']} scored tokens, {n['n_words']} words (spaces).")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1.3]})
    ref = runs[0]
    for r in runs[1:]:
        a.plot(np.cumsum(ref["nll"] - r["nll"]), label=_label(r), lw=1.2)
    a.axhline(0, color="grey", lw=0.6)
    a.set(xlabel="stride", ylabel=f"cumulative NLL saved vs {_label(ref)} (nats)",
          title="where along the text each reranker gains")
    a.legend(fontsize=8)
    labels = [_label(r) for r in runs]
    vals = [r["results"]["ppl_word"] for r in runs]
    b.barh(labels[::-1], vals[::-1])
    lo = min(vals)
    b.set(xlabel="word-level perplexity", xlim=(lo * 0.95, max(vals) * 1.01))
    for y, v in enumerate(vals[::-1]):
        b.text(v, y, f" {v:.3f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(runs: list[str], out: str | None = None) -> str:
    """Compare complete eval.ppl runs of one text.

    Args:
        runs: Run directories (the first is the reference of the plot's gains, e.g. the none run).
        out: Where to write comparison.md and comparison.png (default: the runs' common parent).
    """
    if len(runs) < 1:
        raise InputError("give at least one eval.ppl run directory")
    loaded = [load_run(Path(d)) for d in runs]
    first = loaded[0]["results"]
    for r in loaded[1:]:
        res = r["results"]
        for key in ("n_tokens", "n_strides"):
            if res[key] != first[key]:
                raise InputError(f"{r['dir']} is a run of another text or other windows ({key} {res[key]} vs "
                                 f"{first[key]} in {loaded[0]['dir']}); compare runs of one text")
    md = table(loaded)
    dest = Path(out) if out else Path(*Path(runs[0]).resolve().parts[:-1])
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "comparison.md").write_text(md)
    plot(loaded, dest / "comparison.png")
    return md + f"\nwritten: {dest / 'comparison.md'}, {dest / 'comparison.png'}\n"


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    def show(md, kwargs):
        print(md, end="")
        return 0

    return run(compare, argv, "python -m eval.compare", after=show, varargs="runs")


if __name__ == "__main__":
    sys.exit(main())
