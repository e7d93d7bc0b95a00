"""Every reranker as a chooser on stored training examples that no fit read, with paired intervals.

    python bench/heldout.py --data runs/real/heldout-data --rerankers runs/real/rerankers/*-* --cosine configs/real/fit_bi.yaml

The fits validate on 5 % of their own shards (78 examples): too few to tell apart rerankers whose
difference is a tenth of a nat. Shards generated after the fits' (``bench/real_reranker.py heldout``
links them) are examples of the same kind that no fit saw, hundreds of them, and scoring them costs
encoder passes only (the LM's log p(y | d; x) of each candidate is stored). For each reranker the
candidate it ranks first is "chosen"; printed: the mean −log p(y | d; x) of the choice (nats per
target), the share of the BM25-to-oracle gap that captures, how often it is BM25's first, and paired
bootstrap intervals (examples resampled) of its difference from BM25's first and from each baseline
given with ``--against``. Nothing evaluated is read, so settings may be chosen here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def stored_examples(data_dir: str | Path, k: int):
    """Every example of the shards in ``data_dir`` (datasets.Dataset; no split) and the LM's
    log-probabilities ``[n, k]`` of its first ``k`` candidates (-inf on missing ones)."""
    from reranking.data import RerankDataModule

    ds = RerankDataModule(data_dir=str(data_dir), tokenizer="minilm-l6")._load()
    lm = np.full((len(ds), k), -np.inf)
    for i, row in enumerate(ds["lm_logprobs"]):
        lm[i, :min(k, len(row))] = row[:k]
    return ds, lm


def choose(ds, k: int, selector, batch_size: int = 32) -> np.ndarray:
    """The index of the candidate an evaluation selector (``PredictiveSelector`` for an export, BM25 prior
    included; ``CosineSelector`` for the cosine row) ranks first among each example's first ``k``, given
    the stored prefix as the stride's prefix text and the stored passages with their BM25 scores."""
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch

    picks: list[int] = []
    for start in range(0, len(ds), batch_size):
        rows = ds[start:start + batch_size]
        cands = [[Passage(str(j), "", text, float(score)) for j, (text, score) in enumerate(zip(texts[:k], scores[:k]))]
                 for texts, scores in zip(rows["doc_texts"], rows["bm25_scores"])]
        picks += selector.select(StrideBatch(list(rows["prefix_text"]), cands, [int(i) for i in rows["id"]]))
    return np.asarray(picks)


def table(lm: np.ndarray, picks: dict[str, np.ndarray], against: list[str], resamples: int = 1000,
          seed: int = 0, groups: np.ndarray | None = None) -> str:
    """Markdown table of each chooser's mean −log p(y | chosen d), with paired bootstrap 95 % intervals
    of its difference from BM25's first (candidate 0) and from each chooser in ``against``. ``groups``
    (an integer per example, e.g. its article): resample whole groups, since examples of one article are
    not independent; the mean of a resample is its examples' mean (singleton groups: the plain bootstrap)."""
    n = len(lm)
    nll = {name: -lm[np.arange(n), p] for name, p in picks.items()}
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
            "vs BM25's first [95% CI]"] + [f"vs {a} [95% CI]" for a in against]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, p in picks.items():
        cells = [name, f"{nll[name].mean():.3f}", f"{(bm25.mean() - nll[name].mean()) / (bm25.mean() - oracle.mean()):.1%}",
                 f"{(p == 0).mean():.1%}", diff(nll[name], bm25)]
        cells += ["-" if a == name else diff(nll[name], nll[a]) for a in against]
        lines.append("| " + " | ".join(cells) + " |")
    unit = "examples" if g == n else f"{g} articles"
    return (f"{n} examples; BM25's first {bm25.mean():.3f}, oracle {oracle.mean():.3f} "
            f"(mean -log p(y | d; x) per target; intervals resample {unit})\n\n" + "\n".join(lines) + "\n")


class PickCache:
    """Each chooser's picks on a held-out directory, kept under ``DATA/picks/`` by the identity of what
    chose (an export's file hashes; the cosine row's settings) and of the shards and ``k``: a table with
    one new reranker costs that reranker's encoder passes only. A changed export or shard misses."""

    def __init__(self, data: Path, k: int):
        from ralm.files import file_sha256

        self.dir = data / "picks"
        self.data_id = [(f.name, file_sha256(f)) for f in sorted(data.glob("*.parquet"))] + [("k", str(k))]

    def get(self, name: str, identity: list, compute) -> np.ndarray:
        import hashlib
        import json

        from ralm.files import atomic_write

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
    from ralm.files import file_sha256

    return [(f.name, file_sha256(f)) for f in sorted(export.iterdir()) if f.is_file()]


def cosine_identity(config: Path) -> list:
    import yaml

    m = yaml.safe_load(config.read_text())["model"]
    return ["cosine", m["encoder"], m["max_prefix_tokens"], m["max_passage_tokens"]]


def main(argv: list[str] | None = None) -> int:
    from reranking.encoder_selectors import PredictiveSelector

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="directory of data_gen.build shards no fit read")
    ap.add_argument("--rerankers", nargs="+", default=[], help="export directories (reranking.fit --export_dir)")
    ap.add_argument("--cosine", default=None, help="a bi-encoder fit config: add its untrained encoder as 'cosine', "
                                                    "built as eval.ppl's cosine row (demo.run.cosine_flags)")
    ap.add_argument("--k", type=int, default=8, help="candidates per example (the fits' --data.max_candidates)")
    ap.add_argument("--against", default="", help="comma-separated reranker names to compare each row with")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--device", default="auto", help="where the rerankers run: auto (cuda if present), cpu, cuda")
    ap.add_argument("--batch_size", type=int, default=64, help="encoder rows per forward (larger on a GPU)")
    ap.add_argument("--by-article", action="store_true",
                    help="resample whole source articles for the intervals (examples of one article are correlated)")
    a = ap.parse_args(argv)
    from ralm.scoring import resolve_device

    a.device = resolve_device(a.device)
    ds, lm = stored_examples(a.data, a.k)
    cache = PickCache(Path(a.data), a.k)
    picks = {}
    if a.cosine:
        picks["cosine"] = cache.get("cosine", cosine_identity(Path(a.cosine)),
                                    lambda: choose(ds, a.k, cosine_selector(Path(a.cosine), a.device, a.batch_size)))
    for r in a.rerankers:
        picks[Path(r).name] = cache.get(Path(r).name, export_identity(Path(r)),
                                        lambda: choose(ds, a.k, PredictiveSelector.from_path(r, a.device, a.batch_size)))
    text = table(lm, picks, [x for x in a.against.split(",") if x], groups=article_of(a.data) if a.by_article else None)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


def article_of(data_dir: str | Path) -> np.ndarray:
    """Each stored example's source article (in :func:`stored_examples`'s order), as an integer."""
    from datasets import load_dataset

    from reranking.data import parquet_files

    titles = load_dataset("parquet", data_files=parquet_files(data_dir), split="train")["source_title"]
    return np.unique(np.asarray(titles), return_inverse=True)[1]


def cosine_selector(config: Path, device: str = "cpu", batch_size: int = 64):
    """The cosine row of ``eval.ppl`` for a bi-encoder fit config: its encoder, untrained, with the fit's
    prefix and passage lengths (what ``demo.run.cosine_flags`` passes the evaluation)."""
    import yaml

    from reranking.encoder_selectors import CosineSelector

    m = yaml.safe_load(config.read_text())["model"]
    return CosineSelector(m["encoder"], prefix_tokens=m["max_prefix_tokens"], passage_tokens=m["max_passage_tokens"],
                          batch_size=batch_size, device=device)


if __name__ == "__main__":
    sys.exit(main())
