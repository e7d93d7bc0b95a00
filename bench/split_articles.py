"""Split a ``data_gen.build`` dataset in two by source article: one part to fit on, one to judge on.

    python bench/split_articles.py --data runs/gpu/smollm2-wt2-50k --fit runs/gpu/art-fit --heldout runs/gpu/art-heldout

Training prefixes are sampled at many positions of every article, so examples split by id (the fits'
validation split, or later shards) share articles with the fit: a reranker that learned which passages
suit one article's text is then judged on more text of that article. Splitting by article (a hash of
the title, so the same title always lands on the same side) leaves ``bench/heldout.py`` examples from
articles no fit read, as the evaluated test articles are. Each output is a dataset ``reranking.fit
--data.data_dir`` and ``bench/heldout.py --data`` read (the input's shards, filtered; ``split.json``
records the source, fraction, seed and counts).
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a data_gen.build output directory")
    ap.add_argument("--fit", required=True, help="new directory for the examples of the fit's articles")
    ap.add_argument("--heldout", required=True, help="new directory for the examples of the held-out articles")
    ap.add_argument("--fraction", type=float, default=0.5, help="share of the articles held out (default 0.5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the title hash")
    a = ap.parse_args(argv)
    if not 0 < a.fraction < 1:
        raise SystemExit(f"--fraction {a.fraction}: must be between 0 and 1")
    print(json.dumps(split(Path(a.data), Path(a.fit), Path(a.heldout), a.fraction, a.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
