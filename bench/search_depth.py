"""BM25 with excluded titles: the shallow first depth (2k, doubled where short) against the reference's 100.

    python bench/search_depth.py --index runs/demo/corpus/index --text runs/demo/world/eval.txt
    python bench/search_depth.py --index CORPUS_INDEX --text CORPUS_TEXT --exclude-source

Queries are the last 32 words before every 4th word of the text (as eval.ppl's stride would form
them); every article heading of the text is forbidden, as in evaluation. With ``--exclude-source``
the text is the corpus itself and each query excludes only its own article's title, as data_gen's
training queries do (the article's other passages then crowd the top of the ranking). Both settings run in this one
process, alternating, ``--repeats`` times; the script checks that they return the same passages and
prints the time of each and their ratio. Run it where no torch work shares the process (the JVM).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="a Lucene index directory (ralm.corpus --out DIR gives DIR/index)")
    ap.add_argument("--text", required=True, help="a raw-WikiText file; its headings are the forbidden titles")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exclude-source", action="store_true", help="data_gen's exclusion instead of evaluation's")
    a = ap.parse_args(argv)

    import random

    from ralm.articles import forbidden_titles, iter_articles
    from ralm.retrieval import BM25Retriever

    text = Path(a.text).read_text()
    if a.exclude_source:
        spots = [(title, body.split()) for title, body in iter_articles(text)]
        spots = [(t, w, i) for t, w in spots for i in range(32, len(w), 4)]
        spots = random.Random(0).sample(spots, min(a.queries, len(spots)))
        queries = [" ".join(w[i - 32:i]) for _, w, i in spots]
        exclude, forbidden = [t for t, _, _ in spots], set()
    else:
        words = text.split()
        queries = [" ".join(words[max(0, i - 32):i]) for i in range(32, len(words), 4)][: a.queries]
        exclude, forbidden = None, forbidden_titles(text)
    r = BM25Retriever(a.index)
    settings = {"first depth 2k (this project)": 2.0, "first depth 100 (the reference)": 100 / a.k}
    times = {name: [] for name in settings}
    results = {}
    for _ in range(a.repeats):
        for name, factor in settings.items():
            r.overfetch = factor
            t0 = time.perf_counter()
            results[name] = r.search(queries, a.k, exclude_titles=exclude, forbidden=forbidden)
            times[name].append(time.perf_counter() - t0)
    same = len({tuple(tuple(p.docid for p in hits) for hits in res) for res in results.values()}) == 1
    what = "own article excluded" if a.exclude_source else f"{len(forbidden)} forbidden titles"
    print(f"{len(queries)} queries, k {a.k}, {what}, {r.threads} threads; "
          f"identical passages: {same}")
    for name, ts in times.items():
        print(f"  {name:32s} best {min(ts):6.2f} s  (all: {', '.join(f'{t:.2f}' for t in ts)})")
    base, new = (min(times[n]) for n in settings)
    print(f"  speed-up: {new / base:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
