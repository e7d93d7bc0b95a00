"""Rerankers as choosers on stored examples no fit read, with paired intervals: the work of
``python -m reranking.heldout`` (the dev judge)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from datasets import load_dataset

from ralm.files import atomic_write, file_sha256
from ralm.retrieval import Passage
from ralm.scoring import resolve_device
from ralm.selectors import StrideBatch
from ralm.settings import EncoderInput, InputError
from reranking.data import parquet_files
from reranking.encoder_selectors import CosineSelector, PredictiveSelector


def stored_examples(data_dir: str | Path, k: int):
    """Every example of the shards in ``data_dir`` (a datasets.Dataset; no split), the LM's log-probabilities
    ``[n, k]`` of its first ``k`` candidates (-inf on missing ones) and without a passage ``[n]`` (NaN where
    not stored)."""
    ds = load_dataset("parquet", data_files=parquet_files(data_dir), split="train")
    lm = np.full((len(ds), k), -np.inf)
    for i, row in enumerate(ds["lm_logprobs"]):
        lm[i, :min(k, len(row))] = row[:k]
    nodoc = (np.array([np.nan if v is None else v for v in ds["nodoc_logprob"]], dtype=float)
             if "nodoc_logprob" in ds.column_names else np.full(len(ds), np.nan))
    return ds, lm, nodoc


def chosen_logprob(lm: np.ndarray, nodoc: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """log p(y | chosen d; x) of each example: its candidate's, or without a passage where the pick is -1."""
    got = np.where(picks >= 0, lm[np.arange(len(lm)), np.maximum(picks, 0)], nodoc)
    if np.isnan(got).any():
        raise InputError("a reranker chose no passage where the data stores no nodoc_logprob; judge it on data "
                         "built by data_gen.build (which stores it)")
    return got


def choose(ds, k: int, selector, batch_size: int = 32) -> np.ndarray:
    """The index of the candidate an evaluation selector (``PredictiveSelector`` for an export, BM25 prior
    included; ``CosineSelector`` for the cosine row) ranks first among each example's first ``k``, given
    the stored prefix as the stride's prefix text and the stored passages with their BM25 scores."""
    picks: list[int] = []
    for start in range(0, len(ds), batch_size):
        rows = ds[start:start + batch_size]
        cands = [[Passage(str(j), "", text, float(score)) for j, (text, score) in enumerate(zip(texts[:k], scores[:k]))]
                 for texts, scores in zip(rows["doc_texts"], rows["bm25_scores"])]
        picks += selector.select(StrideBatch(list(rows["prefix_text"]), cands, [int(i) for i in rows["id"]]))
    return np.asarray(picks)


def table(lm: np.ndarray, picks: dict[str, np.ndarray], against: list[str], resamples: int = 1000,
          seed: int = 0, groups: np.ndarray | None = None, nodoc: np.ndarray | None = None) -> str:
    """Markdown table of each chooser's mean −log p(y | chosen d), with paired bootstrap 95 % intervals
    of its difference from BM25's first (candidate 0) and from each chooser in ``against``. ``groups``
    (an integer per example, e.g. its article): resample whole groups, since examples of one article are
    not independent; the mean of a resample is its examples' mean (singleton groups: the plain bootstrap).
    A pick of -1 is no passage (``nodoc``: log p(y | x) per example); a column says how often, where any did."""
    n = len(lm)
    nodoc = np.full(n, np.nan) if nodoc is None else nodoc
    nll = {name: -chosen_logprob(lm, nodoc, p) for name, p in picks.items()}
    abstained = any((p < 0).any() for p in picks.values())
    bm25, oracle = -lm[:, 0], -lm.max(1)
    groups = np.arange(n) if groups is None else np.unique(groups, return_inverse=True)[1]
    g = int(groups.max()) + 1 if n else 0
    boot = np.random.default_rng(seed).integers(g, size=(resamples, g))
    sizes = np.bincount(groups, minlength=g)[boot].sum(1)

    def diff(a: np.ndarray, b: np.ndarray) -> str:
        d = a - b
        lo, hi = np.percentile(np.bincount(groups, d, minlength=g)[boot].sum(1) / sizes, [2.5, 97.5])
        return f"{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"

    head = ["reranker", "mean -log p(y given chosen d)", "gap captured", "chosen = BM25's first",
            *(["no passage chosen"] if abstained else []), "vs BM25's first [95% CI]"] + [f"vs {a} [95% CI]" for a in against]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, p in picks.items():
        cells = [name, f"{nll[name].mean():.3f}", f"{(bm25.mean() - nll[name].mean()) / (bm25.mean() - oracle.mean()):.1%}",
                 f"{(p == 0).mean():.1%}", *([f"{(p < 0).mean():.1%}"] if abstained else []), diff(nll[name], bm25)]
        cells += ["-" if a == name else diff(nll[name], nll[a]) for a in against]
        lines.append("| " + " | ".join(cells) + " |")
    unit = "examples" if g == n else f"{g} articles"
    none = (f", no passage {-np.nanmean(nodoc):.3f}, the oracle that may abstain "
            f"{-np.fmax(lm.max(1), nodoc).mean():.3f}" if not np.isnan(nodoc).any() else "")
    return (f"{n} examples; BM25's first {bm25.mean():.3f}, oracle {oracle.mean():.3f}{none} "
            f"(mean -log p(y | d; x) per target; intervals resample {unit})\n\n" + "\n".join(lines) + "\n")


def summary(lm: np.ndarray, picks: dict[str, np.ndarray], nodoc: np.ndarray) -> dict:
    """The table's point estimates as data: each chooser's mean −log p(y | chosen d), the share of the gap from
    BM25's first to the oracle it captures, how often it chose BM25's first and no passage."""
    bm25, oracle = float(-lm[:, 0].mean()), float(-lm.max(1).mean())
    rows = {}
    for name, p in picks.items():
        nll = float(-chosen_logprob(lm, nodoc, p).mean())
        rows[name] = {"nll": nll, "gap_captured": (bm25 - nll) / (bm25 - oracle), "bm25_first": float((p == 0).mean()),
                      "no_passage": float((p < 0).mean())}
    full = not np.isnan(nodoc).any()
    return {"examples": len(lm), "bm25_first_nll": bm25, "oracle_nll": oracle,
            "no_passage_nll": float(-nodoc.mean()) if full else None,
            "oracle_abstain_nll": float(-np.fmax(lm.max(1), nodoc).mean()) if full else None, "rows": rows}


class PickCache:
    """Each chooser's picks on a held-out directory, kept under ``DATA/picks/`` by the identity of what
    chose (an export's file hashes; the cosine row's settings) and of the shards and ``k``: a table with
    one new reranker costs that reranker's encoder passes only. A changed export or shard misses."""

    def __init__(self, data: Path, k: int):
        self.dir = data / "picks"
        self.data_id = [(f.name, file_sha256(f)) for f in sorted(data.glob("*.parquet"))] + [("k", str(k))]

    def get(self, name: str, identity: list, compute) -> np.ndarray:
        key = hashlib.sha256(json.dumps([self.data_id, identity]).encode()).hexdigest()[:16]
        path = self.dir / f"{name}-{key}.npy"
        if path.is_file():
            print(f"{name}: picks from {path}", file=sys.stderr, flush=True)
            return np.load(path)
        picks = compute()

        def save(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.save would add ".npy" to the temporary name
                np.save(f, picks)

        atomic_write(path, save)
        print(f"{name}: {len(picks)} examples chosen", file=sys.stderr, flush=True)
        return picks


def export_identity(export: Path) -> list:
    return [(f.name, file_sha256(f)) for f in sorted(export.iterdir()) if f.is_file() and not f.name.startswith(".")]


def article_of(ds) -> np.ndarray:
    """Each stored example's source article, as an integer (the resampling unit of ``--by_article``)."""
    return np.unique(np.asarray(ds["source_title"]), return_inverse=True)[1]


def judge(data: str, rerankers: list[str] | None, cosine: str | None, input: EncoderInput, k: int,
          against: list[str] | None, out: str | None, device: str, batch_size: int, by_article: bool,
          skip_missing: bool = False) -> str:
    """``python -m reranking.heldout``'s work: each reranker's choices on ``data``'s examples, as a table."""
    if out and Path(out).suffix == ".json":
        raise InputError(f"--out {out}: the table's file (e.g. judge.md); its numbers go beside it as .json")
    dev = resolve_device(device)
    ds, lm, nodoc = stored_examples(data, k)
    cache = PickCache(Path(data), k)
    picks = {}
    if cosine:
        picks["cosine"] = cache.get("cosine", ["cosine", cosine, json.dumps(input.__dict__)],
                                    lambda: choose(ds, k, CosineSelector(cosine, input=input, batch_size=batch_size,
                                                                         device=dev)))
    embedded: dict = {}  # passage embeddings shared by rerankers with one passage tower (query-side fits)

    def selector(r: str) -> PredictiveSelector:
        sel = PredictiveSelector.from_path(r, dev, batch_size)
        sel.share_passage_embeddings(embedded)
        return sel

    for r in rerankers or []:
        if skip_missing and not (Path(r) / "reranker.json").is_file():
            print(f"[reranking.heldout] {r}: not exported yet, left out", file=sys.stderr, flush=True)
            continue
        if not Path(r).is_dir():
            raise InputError(f"--rerankers: {r!r} is not an export directory")
        picks[Path(r).name] = cache.get(Path(r).name, export_identity(Path(r)),
                                        lambda r=r: choose(ds, k, selector(r)))
    against = [a for a in against or [] if a in picks or not skip_missing]
    bad = [a for a in against if a not in picks]
    if bad or not picks:
        raise InputError(f"--against {bad}: not a row (rows: {', '.join(picks) or 'none: give --rerankers or --cosine'})")
    text = table(lm, picks, list(against or []), groups=article_of(ds) if by_article else None, nodoc=nodoc)
    if out:
        atomic_write(Path(out), lambda t: Path(t).write_text(text))
        numbers = json.dumps(summary(lm, picks, nodoc), indent=1)
        atomic_write(Path(out).with_suffix(".json"), lambda t: Path(t).write_text(numbers))
    return text
