"""Stage "retrieve": BM25 top-k per example, in the main process only (the JVM does not survive fork).

Per example: query = decode of the ℓ tokens before the targets; candidates whose title equals the
example's source article title are excluded (the reranker must not learn to find the verbatim
continuation), and so are the forbidden evaluation titles. Results are written per shard
(``work/retrieved/shard-NNNNN.parquet``); finished shards are skipped on resume.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np
import pyarrow as pa

from ralm.retrieval import query_text

from .config import BuildConfig, BuildError
from .shards import RETRIEVED_SCHEMA, Layout, atomic_write_json, atomic_write_parquet


def open_retriever(build: BuildConfig, threads: int | None):
    """The BM25 retriever, with input problems turned into :class:`BuildError` naming ``--index``."""
    from ralm.retrieval import BM25Retriever

    try:
        retriever = BM25Retriever(build.index, k1=build.k1, b=build.b, threads=threads)
    except (ValueError, RuntimeError) as e:
        raise BuildError(f"--index {build.index!r}: {e}") from e
    if build.k > retriever.num_docs:
        raise BuildError(f"--k {build.k} is larger than the corpus: index {build.index!r} has only "
                         f"{retriever.num_docs} passage(s). Lower --k or use a larger index.")
    return retriever


def retrieve_shard(retriever, build: BuildConfig, tokenizer, ids: np.ndarray, example_ids: np.ndarray,
                   positions: np.ndarray, titles: list[str], forbidden: Collection[str], batch: int,
                   progress=None) -> pa.Table:
    """One shard's candidates as a :data:`RETRIEVED_SCHEMA` table."""
    from ralm.corpus import detokenize_title

    queries = [query_text(tokenizer, ids, int(p), build.query_tokens) for p in positions]
    results = []
    for i in range(0, len(queries), batch):
        results += retriever.search(queries[i:i + batch], build.k, exclude_titles=titles[i:i + batch],
                                    forbidden=forbidden)
        if progress is not None:
            progress.update(min(batch, len(queries) - i))
    # The source article may also carry its Wikipedia spelling (DPR: "Kiss You (One Direction song)" for
    # WikiText's "Kiss You ( One Direction song )"): exclude both spellings, per source title.
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(titles):
        if t and detokenize_title(t) != t:
            groups.setdefault(t, []).append(i)
    for t, idx in groups.items():
        again = retriever.search([queries[i] for i in idx], build.k, exclude_titles=[detokenize_title(t)] * len(idx),
                                 forbidden=set(forbidden) | {t})
        for i, r in zip(idx, again):
            results[i] = r
    n_cand = [len(r) for r in results]
    notes = []
    for q, n in zip(queries, n_cand):
        if n >= build.k:
            notes.append("")
        elif not q.strip():
            notes.append(f"{n} of {build.k} candidates: the query (last {build.query_tokens} tokens) is blank")
        else:
            notes.append(f"{n} of {build.k} candidates: the index has no more passages that match the query "
                         "outside the source article and the forbidden titles")
    cols = {
        "id": example_ids.astype(np.int64),
        "source_title": titles,
        "position": positions.astype(np.int64),
        "query": queries,
        "doc_ids": [[p.docid for p in r] for r in results],
        "doc_titles": [[p.title for p in r] for r in results],
        "doc_texts": [[p.document() for p in r] for r in results],
        "bm25_scores": [[float(p.score) for p in r] for r in results],
        "n_candidates": n_cand,
        "note": notes,
    }
    return pa.table(cols, schema=RETRIEVED_SCHEMA)


def run_retrieve(layout: Layout, build: BuildConfig, tokenizer, ids: np.ndarray, samples: pa.Table,
                 forbidden: set[str], threads: int | None, batch: int) -> None:
    """Retrieve every shard that has no result file yet (the JVM is started only if one is missing)."""
    from tqdm.auto import tqdm

    todo = [s for s in range(build.n_shards) if not layout.retrieved(s).exists()
            and not layout.shard(s).exists()]
    if not todo:
        print(f"[retrieve] all {build.n_shards} shard(s) already retrieved", flush=True)
        return
    retriever = open_retriever(build, threads)
    info = {"index": build.index, "fingerprint": retriever.fingerprint(), "num_docs": retriever.num_docs,
            "k1": retriever.k1, "b": retriever.b, "n_forbidden_titles": len(forbidden)}
    atomic_write_json(layout.retrieval_info, info)
    positions = samples.column("position").to_numpy()
    titles = samples.column("source_title").to_pylist()
    n_todo = sum(len(build.shard_ids(s)) for s in todo)
    t0 = time.perf_counter()
    with tqdm(total=n_todo, desc="retrieve (BM25)", unit="ex", smoothing=0.05) as bar:
        for s in todo:
            r = build.shard_ids(s)
            table = retrieve_shard(retriever, build, tokenizer, ids, np.arange(r.start, r.stop),
                                   positions[r.start:r.stop], titles[r.start:r.stop], forbidden, batch, bar)
            atomic_write_parquet(layout.retrieved(s), table)
    dt = time.perf_counter() - t0
    print(f"[retrieve] {n_todo:,} queries in {dt:.1f}s ({n_todo / max(dt, 1e-9):,.1f} queries/s)", flush=True)
