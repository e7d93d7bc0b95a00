"""Split a ``data_gen.build`` dataset in two by source article: one part to fit on, one to judge on.

    python bench/split_articles.py --data runs/gpu/smollm2-wt2-50k --fit runs/gpu/art-fit --heldout runs/gpu/art-heldout
    python bench/split_articles.py --text runs/real/texts/train.txt --fit runs/real/texts/train-artfit.txt \
        --heldout runs/real/texts/train-artheldout.txt

Training prefixes are sampled at many positions of every article, so examples split by id (the fits'
validation split, or later shards) share articles with the fit: a reranker that learned which passages
suit one article's text is then judged on more text of that article. Splitting by article (a hash of
the title, so the same title always lands on the same side) leaves ``bench/heldout.py`` examples from
articles no fit read, as the evaluated test articles are. Each output is a dataset ``reranking.fit
--data.data_dir`` and ``bench/heldout.py --data`` read (the input's shards, filtered; ``split.json``
records the source, fraction, seed and counts). With ``--text`` it splits a raw WikiText-layout text
file instead, with the same title hash: ``data_gen.build --text.file`` on the fit side then samples
training prefixes only from the articles whose examples the dataset split would put on the fit side,
and no LM time is spent scoring examples of the held-out articles.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def heldout_titles(titles: list[str], fraction: float, seed: int) -> np.ndarray:
    """True for the titles on the held-out side: the fits' validation hash (``reranking.data``) on titles."""
    from reranking.data import hashed_below

    return hashed_below(titles, fraction, seed)


def split(data: Path, fit: Path, heldout: Path, fraction: float, seed: int) -> dict:
    """Write each shard's examples to ``fit`` or ``heldout`` by article; returns the counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reranking.data import parquet_files

    for d in (fit, heldout):
        if d.exists() and any(d.iterdir()):
            raise SystemExit(f"{d} is not empty: pick new output directories or delete it")
        d.mkdir(parents=True, exist_ok=True)
    counts = {"fit": 0, "heldout": 0}
    titles = {"fit": set(), "heldout": set()}
    for f in parquet_files(data):
        table = pq.read_table(f)
        names = table.column("source_title").to_pylist()
        held = heldout_titles(names, fraction, seed)
        for side, mask, d in (("fit", ~held, fit), ("heldout", held, heldout)):
            part = table.filter(pa.array(mask, pa.bool_()))
            if part.num_rows:
                pq.write_table(part, d / Path(f).name, compression="zstd")
            counts[side] += part.num_rows
            titles[side].update(t for t, m in zip(names, mask) if m)
    record = {"source": str(data), "heldout_fraction": fraction, "seed": seed,
              "examples": counts, "articles": {k: len(v) for k, v in titles.items()}}
    for d in (fit, heldout):
        (d / "split.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def split_text(text: Path, fit: Path, heldout: Path, fraction: float, seed: int) -> dict:
    """Write the articles of a raw WikiText-layout text to ``fit`` or ``heldout`` by the same title hash.

    The pieces are ``ralm.corpus.split_articles``'s (the titles ``data_gen`` records as ``source_title``);
    text before the first heading has no article and is dropped.
    """
    from ralm.corpus import split_articles

    for f in (fit, heldout):
        if f.exists():
            raise SystemExit(f"{f} exists: pick new output files or delete it")
    articles = [(p, t) for p, t in zip(*split_articles(text.read_text(encoding="utf-8"))) if t]
    held = heldout_titles([t for _, t in articles], fraction, seed)
    for f, side in ((fit, False), (heldout, True)):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(p for (p, _), h in zip(articles, held) if h == side), encoding="utf-8")
    return {"source": str(text), "heldout_fraction": fraction, "seed": seed,
            "articles": {"fit": int((~held).sum()), "heldout": int(held.sum())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a data_gen.build output directory")
    src.add_argument("--text", help="a raw WikiText-layout text file (then --fit and --heldout are new text files)")
    ap.add_argument("--fit", required=True, help="new directory (file, with --text) for the fit's articles")
    ap.add_argument("--heldout", required=True, help="new directory (file, with --text) for the held-out articles")
    ap.add_argument("--fraction", type=float, default=0.5, help="share of the articles held out (default 0.5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the title hash")
    a = ap.parse_args(argv)
    if not 0 < a.fraction < 1:
        raise SystemExit(f"--fraction {a.fraction}: must be between 0 and 1")
    run = split_text if a.text else split
    print(json.dumps(run(Path(a.text or a.data), Path(a.fit), Path(a.heldout), a.fraction, a.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
