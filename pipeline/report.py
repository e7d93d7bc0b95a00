"""The report stage's ``report.md``: what ran, each text's tables as ``eval.compare`` wrote them, the plots, and
where every artifact is.

The tables are ``eval.compare``'s ``comparison.md`` files pasted whole (paired article-bootstrap intervals, sign
tests, the gap to the oracle closed, cost per 1,000 strides); this module adds a plot of perplexity against
cost per reranker, the learning curve where the fits read different amounts of data (:mod:`pipeline.curve`), and
the paths. Nothing here computes a statistic of its own.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import matplotlib

from eval.compare import load_run, notes
from pipeline import curve
from pipeline.plan import Recipe
from ralm.files import atomic_write

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)


def _results(d: Path) -> dict | None:
    f = d / "results.json"
    return json.loads(f.read_text()) if f.is_file() else None


def cost_plot(r: Recipe, text: str, path: Path) -> None:
    """Word perplexity against seconds of scoring per 1,000 strides, one point per row. A row that took earlier
    rows' LM scores (reuse) has no full cost; it is drawn hollow at what it spent itself (its ranking and the
    forwards nobody lent it), a lower bound."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, _ in r.rows(text):
        res = _results(r.root / "ppl" / text / name)
        if res is None:
            continue
        full, spent = res.get("seconds_per_1000_strides"), res.get("seconds_spent_per_1000_strides")
        x = full if full is not None else spent
        if x is None:
            continue
        ax.scatter([x], [res["ppl_word"]], s=40, facecolors="C0" if full is not None else "none", edgecolors="C0")
        ax.annotate(name, (x, res["ppl_word"]), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.set(xscale="symlog", xlabel="seconds of scoring per 1,000 strides (hollow: reused LM scores, a lower bound)",
           ylabel="word-level perplexity", title=f"{text}: perplexity against cost")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def machine() -> str:
    """The CPU (model name and whether it runs bf16 natively) and the library versions, for every timing."""
    model = "unknown CPU"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        model = platform.processor() or model
    native = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(native) if native else 'no native bf16: avx2' if 'avx2' in flags else 'no native bf16'})"


def write_report(r: Recipe) -> Path:
    """Write ``OUT/report/report.md`` (and each text's cost plot) from the finished runs; returns its path."""
    root = r.root / "report"
    lines = [f"# Report: {r.out}", "", "| | |", "|---|---|",
             f"| LM | {r.lm or '(the data and eval configs)'} |",
             *([f"| LM reading the texts | {r.eval.lm} (the rerankers learnt the other LM's preferences) |"]
               if r.eval.lm else []),
             f"| reranker encoder | {r.encoder or '(the fit configs)'} |",
             f"| corpus | {r.corpus.index or r.corpus_file()} ({_passages(r)}) |",
             f"| training data | {_data(r)} |",
             *(f"| fit {f.name} | {', '.join(f.configs)}{' + ' + json.dumps(f.set) if f.set else ''}; seeds "
               f"{', '.join(map(str, f.seeds))}{'; and its untrained start' if f.untrained else ''} |" for f in r.fits),
             f"| precision | {r.precision} (resolved per run: each results.json's `precision`) |",
             f"| machine | {machine()} |", ""]
    if r.judge:
        root.mkdir(parents=True, exist_ok=True)
        judge = r.root / "judge" / "judge.md"
        lines += ["## the held-out judge", "", f"Examples of the training articles no fit read ({_data(r, 'judge/data')}): "
                  "each export chooses one of the stored candidates; the LM's log-probabilities are stored.", ""]
        points = curve.judge_table(r)
        if points:
            atomic_write(root / "judge-curve.png", lambda t: curve.judge_plot(r, Path(t)))
            lines += ["### the learning curve", "", *points, "![the judge's learning curve](judge-curve.png)", ""]
        lines += [judge.read_text().rstrip() if judge.is_file() else
                  "(not run yet: `python -m pipeline ... --stage judge`)", ""]
    for text in r.eval_texts():
        tdir = root / text
        tdir.mkdir(parents=True, exist_ok=True)
        lines += [f"## {text}", ""]
        points = curve.table(r, text)
        if points:
            atomic_write(tdir / "curve.png", lambda t: curve.plot(r, text, Path(t)))
            lines += ["### the learning curve", "", *points, f"![{text}: the learning curve]({text}/curve.png)", ""]
        said = _notes(r, text)
        lines += [said] if said else []
        for base in r.baselines(text) or ["bm25"]:
            table = tdir / f"vs-{base}" / "comparison.md"
            lines += [f"### against {base}", "", table.read_text().removeprefix(said).rstrip() if table.is_file() else
                      f"(not written yet: `python -m eval.compare ... --baseline {base}`)", "",
                      f"![{text} against {base}]({text}/vs-{base}/comparison.png)", ""]
        atomic_write(tdir / "cost.png", lambda t: cost_plot(r, text, Path(t)))
        lines += [f"![{text}: perplexity against cost]({text}/cost.png)", ""]
    lines += ["## Where everything is", "", "| what | path |", "|---|---|",
              *(f"| export {row} | {r.root / 'rerankers' / row} |" for f in r.fits
                for row in ([f"{f.name}-untrained"] if f.untrained else []) + f.rows()),
              f"| TensorBoard | `tensorboard --logdir {r.root / 'logs'}` |",
              f"| training data | {r.root / 'data'} |",
              *([f"| the judge's examples, its table (.md) and numbers (.json) | {r.root / 'judge'} |"] if r.judge else []),
              f"| evaluations | {r.root / 'ppl'}/TEXT/ROW/ (results.json, strides.parquet, plot.png) |",
              f"| this report | {root / 'report.md'} |", ""]
    atomic_write(root / "report.md", lambda t: Path(t).write_text("\n".join(lines)))
    return root / "report.md"


def write_judge_curve(r: Recipe) -> Path | None:
    """``OUT/judge/curve.md`` (the learning curve on the judge, with the judge's table) and ``curve.png``, where
    the fits differ in the data they read; None where there is no curve."""
    lines = curve.judge_table(r)
    if not lines:
        return None
    d = r.root / "judge"
    atomic_write(d / "curve.png", lambda t: curve.judge_plot(r, Path(t)))
    table = (d / "judge.md").read_text().rstrip() if (d / "judge.md").is_file() else ""
    atomic_write(d / "curve.md", lambda t: Path(t).write_text("\n".join([*lines, table, ""])))
    return d / "curve.md"


def _notes(r: Recipe, text: str) -> str:
    """eval.compare's notes on the text's finished rows (retrieval hurts, few articles), said once above its
    tables (each comparison.md begins with them too)."""
    dirs = [r.root / "ppl" / text / name for name, _ in r.rows(text)]
    runs = [load_run(d) for d in dirs if (d / "results.json").is_file()]
    return notes(runs) if runs else ""


def _passages(r: Recipe) -> str:
    f = r.root / "corpus" / "corpus.json"
    if f.is_file():
        return f"{json.loads(f.read_text())['passages']:,} passages"
    return "an existing index" if r.corpus.index else "not indexed yet"


def _data(r: Recipe, where: str = "data") -> str:
    f = r.root / where / "manifest.json"
    if not f.is_file():
        return "not built yet"
    m = json.loads(f.read_text())
    scores = (r.judge if where != "data" else r.data).scores_files
    return (f"{m['examples']:,} examples, content hash {m['content_hash'][:16]}…"
            + (f" (from {', '.join(scores)})" if scores else ""))
