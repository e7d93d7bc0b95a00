"""``python -m eval.compare RUN_DIR...``: several ``eval.ppl`` runs of one text side by side.

Prints one Markdown table (word- and token-level perplexity, relative change against the ``none`` run,
the change against a baseline run (``--baseline``, default ``bm25``) with its paired bootstrap 95 %
interval over whole articles and the bootstrap p-value, the strides whose NLL went down / up against it
with the sign test's p-value (:mod:`eval.stats`), the share of strides that took BM25's first hit, and
the cost: seconds of scoring per 1,000 strides, as each run measured it), with a row for the mean of
every reranker trained with several seeds (run directories ``NAME-seedN``), and writes a plot: each run's
per-stride NLL gain over the first run given (cumulative, along the text) and the perplexities. Runs
must be complete and of the same text and windows; anything else is refused with the directory named.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pyarrow.parquet as pq

from eval.results import read_complete
from eval.stats import BOOTSTRAP_SAMPLES, DEFAULT_BLOCKS, p_cell, paired_bootstrap, sign_test, units_of
from ralm.cli import run
from ralm.settings import InputError


def load_run(d: Path) -> dict:
    res = read_complete(d)
    if res is None:
        raise InputError(f"{d} holds no complete eval.ppl run (results.json missing or its files changed); "
                         "rerun eval.ppl there to finish it")
    t = pq.read_table(d / "strides.parquet")
    return {"dir": d, "results": res, "nll": t.column("nll").to_numpy(), "rank": t.column("chosen_rank").to_numpy(),
            "n_tokens": t.column("n_tokens").to_numpy(), "n_candidates": t.column("n_candidates").to_numpy(),
            "article": t.column("article").to_numpy() if "article" in t.column_names else None,
            "docid": np.array(t.column("chosen_docid").to_pylist(), dtype=object)}


def lm_input(run: dict) -> tuple | None:
    """What the LM's input of a stride depends on besides its passage id: the model, the computed precision,
    the windows (``zero_shot_tokens`` only ranks) and where passage ids are read (the index, or the retrieval
    file); None where the run does not record them."""
    ident, precision = run["results"].get("identity"), run["results"].get("precision")
    if not ident or not precision or run.get("docid") is None:
        return None
    windows = {k: v for k, v in ident["windows"].items() if k != "zero_shot_tokens"}
    source = ident.get("retrieval") or {}
    return (repr(ident["model"]), precision.split()[0], repr(sorted(windows.items())),
            repr(source.get("index") or source.get("sha256")))


def same_input(group: list[dict], base: dict) -> np.ndarray | None:
    """Per stride: True where every run of ``group`` put the baseline's passage (or none, like it) in front of
    the same window for the same LM; None when their LM inputs differ in more than the passage."""
    if lm_input(base) is None or any(lm_input(r) != lm_input(base) for r in group):
        return None
    return np.logical_and.reduce([r["docid"] == base["docid"] for r in group])


def _label(run: dict) -> str:
    """A run by its directory, which the user (or the pipeline: the row's name) named: a built-in reranker's run
    is usually named for it, and two runs of one reranker (other settings) stay apart."""
    return Path(run["dir"]).name


def mean_of_seeds(ppls: list[float]) -> float:
    """Several seeds' perplexities as one: their geometric mean (the mean of their log-perplexities)."""
    return math.exp(np.mean([math.log(x) for x in ppls]))


def gap_closed(baseline: float, oracle: float, ppl: float) -> float | None:
    """The share of the baseline-to-oracle distance in word perplexity that ``ppl`` covers (None: no distance)."""
    return (baseline - ppl) / (baseline - oracle) if baseline != oracle else None


def seed_groups(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs of one reranker trained with several seeds: directories named ``NAME-seedN``, by NAME (two or more)."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        m = re.fullmatch(r"(.+)-seed\d+", Path(r["dir"]).name)
        if m:
            groups.setdefault(m.group(1), []).append(r)
    return {k: v for k, v in groups.items() if len(v) >= 2}


#: Fewer resampling units (articles) than this and the report says its intervals are rough.
FEW_UNITS = 10


def notes(runs: list[dict], blocks: int = DEFAULT_BLOCKS) -> str:
    """What the tables cannot show by themselves, as lines to put above them ("" when nothing to say): that
    retrieval hurts the text (``none`` beats bm25, or even the oracle, which picks with the targets in hand),
    and that the intervals rest on few articles."""
    by = {r["results"]["reranker"]: r for r in reversed(runs)}
    out = []
    none = by.get("none")
    if none:
        ppl = none["results"]["ppl_word"]
        worse = [(_label(r), r["results"]["ppl_word"]) for r in runs if r is not none and r["results"]["ppl_word"] > ppl]
        if "bm25" in by and by["bm25"]["results"]["ppl_word"] > ppl or "oracle" in by and by["oracle"]["results"]["ppl_word"] > ppl:
            rows = ", ".join(f"{name} {v:.3f} ({100 * (v / ppl - 1):+.1f}%)" for name, v in worse)
            every = len(worse) == len(runs) - 1
            out.append(f"**Retrieval hurts this text**: no passage (none, word ppl {ppl:.3f}) beats "
                       + ("every retrieval row" if every else "") + (": " if every else "") + rows
                       + (" — the oracle too, which picks among the candidates with the targets in hand: none of them "
                          "is worth the window's own tokens it displaces" if "oracle" in by and
                          by["oracle"]["results"]["ppl_word"] > ppl else "")
                       + ". Levers: a longer window (windows.max_length) or a smaller passage budget "
                         "(windows.doc_max_tokens), so a passage displaces less of the text's own context; a reranker "
                         "that may choose no passage (model.abstain: true in its fit, configs/wikitext2/"
                         "fit-abstain.yaml; the oracle-abstain row shows its ceiling); or no retrieval for this text.")
    unit, unit_name = units_of(len(runs[0]["nll"]), runs[0]["article"], blocks)
    n = int(unit.max()) + 1
    if unit_name == "article" and n < FEW_UNITS:
        out.append(f"**Only {n} articles**: the intervals resample {n} units and can be narrow by chance (a few "
                   "articles carry them); read the sign test beside them, and evaluate more articles before "
                   "concluding.")
    return "".join(f"> {line}\n>\n" for line in out).removesuffix(">\n") + ("\n" if out else "")


def table(runs: list[dict], baseline: str = "bm25", blocks: int = DEFAULT_BLOCKS) -> str:
    """The comparison table; the baseline is the run whose reranker (or directory name) is ``baseline``."""
    # a reranker's name means its first run given; a directory's name, that run
    by = {r["results"]["reranker"]: r for r in reversed(runs)} | {Path(r["dir"]).name: r for r in runs}
    none = by.get("none")
    base = by.get(baseline)
    unit, unit_name = units_of(len(runs[0]["nll"]), runs[0]["article"], blocks)
    bl = _label(base) if base else baseline
    oracle = by.get("oracle")
    gap = base is not None and oracle is not None and oracle is not base
    head = ["run", "word ppl", "token ppl"] + (["vs none"] if none else [])
    if base:
        head += [f"vs {bl} [95% CI]", "p (bootstrap)", f"strides better / worse than {bl}", "p (sign test)"]
    if gap:
        head += [f"gap {bl} → oracle closed"]
    abstained = [r for r in runs if r is not none and "n_candidates" in r
                 and (r["rank"][r["n_candidates"] > 0] < 0).any()]
    head += ["BM25 first chosen", *(["no passage chosen"] if abstained else []), "s / 1k strides"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, group: list[dict]) -> str:
        """One run, or the mean of several seeds' runs (geometric mean of perplexities, mean NLL per stride)."""
        res = [r["results"] for r in group]
        word = mean_of_seeds([x["ppl_word"] for x in res])
        cells = [label, f"{word:.3f}", f"{mean_of_seeds([x['ppl_token'] for x in res]):.3f}"]
        if none:
            cells.append(f"{100 * (word / none['results']['ppl_word'] - 1):+.1f}%")
        if base and group == [base]:
            cells += ["-", "-", "-", "-"]
        elif base:
            nll = np.stack([r["nll"] for r in group])
            bs = paired_bootstrap(nll, base["nll"], group[0]["n_tokens"], res[0]["n_words"], unit, unit_name)
            better, worse, p = sign_test(nll.mean(0), base["nll"], ties=same_input(group, base))
            cells += [bs.cell(), p_cell(bs.p_not_better if bs.change < 0 else 1 - bs.p_not_better),
                      f"{better} / {worse}", p_cell(p)]
        if gap:  # the share of the baseline-to-oracle distance in word perplexity this row covers
            share = gap_closed(base["results"]["ppl_word"], oracle["results"]["ppl_word"], word)
            cells.append("-" if group == [base] else f"{100 * share:.0f}%" if share is not None else "n/a")
        first = [(r["rank"][r["rank"] >= 0] == 0).mean() for r in group if (r["rank"] >= 0).any()]
        cells.append(f"{100 * np.mean(first):.0f}%" if first else "-")
        if abstained:  # of the strides that had candidates: how often the row kept the window's own tokens
            kept = [(r["rank"][r["n_candidates"] > 0] < 0).mean() for r in group
                    if "n_candidates" in r and (r["n_candidates"] > 0).any()]
            cells.append("-" if none is not None and group == [none] or not kept else f"{100 * np.mean(kept):.0f}%")
        costs = [x["seconds_per_1000_strides"] for x in res if x.get("seconds_per_1000_strides") is not None]
        cells.append(f"{np.mean(costs):,.0f}" if costs else "n/a")
        return "| " + " | ".join(cells) + " |"

    groups = seed_groups(runs)
    for r in runs:
        lines.append(row(_label(r), [r]))
        for name, group in groups.items():
            if r is group[-1]:
                lines.append(row(f"**{name}, mean of {len(group)} seeds**", group))
    n = runs[0]["results"]
    lines.append(f"\n{n['n_strides']} strides, {n['n_scored_tokens']} scored tokens, {n['n_words']} words (spaces), "
                 f"{unit.max() + 1} {unit_name}s.")
    if base:
        lines.append(f"Interval: paired bootstrap of the word-perplexity change against {bl}, {BOOTSTRAP_SAMPLES:,} "
                     f"resamples of whole {unit_name}s (eval.stats); p (bootstrap): share of resamples on the other "
                     "side of zero. Sign test: strides with lower / higher NLL than the baseline, ties (the same passage "
                     "given to the same LM) dropped, two-sided.")
    if gap:
        lines.append(f"Gap closed: (word ppl of {bl} - the row's) / (word ppl of {bl} - the oracle's); the oracle picks "
                     "with the targets in hand, an upper bound, not a method.")
    if groups:
        lines.append("Mean of N seeds (runs in directories NAME-seedN): geometric mean of their perplexities; its "
                     "interval resamples the seeds with replacement as well as the units, its sign test compares "
                     "the seeds' mean NLL per stride.")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    matplotlib.use("Agg")
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


def compare(runs: list[str], out: str | None = None, baseline: str = "bm25", blocks: int = DEFAULT_BLOCKS) -> str:
    """Compare complete eval.ppl runs of one text.

    Args:
        runs: Run directories (the first is the reference of the plot's gains, e.g. the none run).
        out: Where to write comparison.md and comparison.png (default: the runs' common parent).
        baseline: The run every other is tested against (interval, sign test): a reranker name (bm25, none,
            ...), a run directory's name or its path; one that names no run given is refused (but the
            default, ``bm25``, is left out of the table when no bm25 run is given).
        blocks: Resampling units when the runs do not record the article of each stride: this many blocks
            of consecutive strides.
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
    if blocks < 2:
        raise InputError(f"--blocks must be >= 2 (got {blocks})")
    names = {r["results"]["reranker"] for r in loaded} | {Path(r["dir"]).name for r in loaded}
    if baseline not in names:  # a run directory's path names its run; anything else but the default is a mistake
        same = [r for r in loaded if Path(r["dir"]).resolve() == Path(baseline).resolve()]
        if same:
            baseline = Path(same[0]["dir"]).name
        elif baseline != "bm25":
            raise InputError(f"--baseline {baseline!r} is none of the runs given; name one of them: "
                             f"{', '.join(sorted(Path(r['dir']).name for r in loaded))}")
    md = notes(loaded, blocks) + table(loaded, baseline, blocks)
    dest = Path(out) if out else Path(*Path(runs[0]).resolve().parts[:-1])
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "comparison.md").write_text(md)
    plot(loaded, dest / "comparison.png")
    return md + f"\nwritten: {dest / 'comparison.md'}, {dest / 'comparison.png'}\n"


def main(argv: list[str] | None = None) -> int:
    def show(md, kwargs):
        print(md, end="")
        return 0

    return run(compare, argv, "python -m eval.compare", after=show, varargs="runs")


if __name__ == "__main__":
    sys.exit(main())
