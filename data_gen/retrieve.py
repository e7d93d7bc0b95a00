"""Stage "retrieve": BM25 top-k per example, in the search process (``ralm.search_process``).

Per example: query = decode of the ℓ tokens before the targets (with ``--targets.candidates shared``, a
window's examples all take its first target's list); candidates whose title equals the
example's source article title are excluded (the reranker must not learn to find the verbatim
continuation; ``--exclude_source false`` keeps them, for a corpus built so that it holds no text of the
training prefixes' own part of the article, e.g. first halves indexed, prefixes from second halves), and so
are the forbidden evaluation titles. Results are written per shard
(``work/retrieved/shard-NNNNN.parquet``); finished shards are skipped on resume.

With ``--stage all`` the shards are retrieved by :class:`RetrieveThread` while earlier shards are being
scored: the scoring data waits only for the shard it needs (:func:`data_gen.shards.wait_for_shard`), so BM25 and the
LM overlap instead of running one after the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

import numpy as np
import pyarrow as pa

from ralm.articles import detokenize_title
from ralm.loading import load_tokenizer
from ralm.retrieval import query_text
from ralm.search_process import SearchProcess
from ralm.settings import InputError

from .config import BuildConfig, BuildError, RunConfig, log
from .shards import RETRIEVED_SCHEMA, Layout, atomic_write_bytes, atomic_write_json, atomic_write_parquet


def open_searcher(build: BuildConfig, verbose: bool = False):
    """The BM25 search process, with input problems turned into :class:`BuildError` naming the setting."""
    try:
        searcher = SearchProcess(build.retrieval.index, k1=build.retrieval.k1, b=build.retrieval.b, verbose=verbose)
    except InputError as e:
        raise BuildError(f"--retrieval.index {build.retrieval.index!r}: {e}") from None
    if build.retrieval.k > searcher.num_docs:
        searcher.close()
        raise BuildError(f"--retrieval.k {build.retrieval.k} is larger than the corpus: index "
                         f"{build.retrieval.index!r} has only {searcher.num_docs} passage(s). Lower --retrieval.k or "
                         "use a larger index")
    return searcher


def retrieve_shard(searcher, build: BuildConfig, tokenizer, ids: np.ndarray, samples: pa.Table,
                   forbidden: Collection[str], batch: int) -> pa.Table:
    """One shard's candidates as a :data:`RETRIEVED_SCHEMA` table (every batch submitted at once, so the
    search process works through them without waiting for this thread); ``samples``: the shard's rows of
    the sampled examples (id, position, source_title)."""
    k, ell = build.retrieval.k, build.retrieval.query_tokens
    example_ids, positions = samples.column("id").to_numpy(), samples.column("position").to_numpy()
    titles = samples.column("source_title").to_pylist()
    queries = [query_text(tokenizer, ids, int(p), ell) for p in positions]
    # shared candidates: only a window's first target searches (its query is every target's past); the others
    # take its list. Every example keeps its own query text.
    m = build.targets.per_window
    lead = [i - int(e) % m if build.targets.candidates == "shared" else i for i, e in enumerate(example_ids)]
    searched = sorted(set(lead))
    q = [queries[i] for i in searched]
    excluded = [titles[i] if build.exclude_source else None for i in searched]
    futures = [searcher.submit(q[i:i + batch], k, exclude_titles=excluded[i:i + batch], forbidden=forbidden)
               for i in range(0, len(q), batch)]
    found = [r for f in futures for r in f.result()]
    # The source article may also carry its Wikipedia spelling (DPR: "Kiss You (One Direction song)" for
    # WikiText's "Kiss You ( One Direction song )"): exclude both spellings, per source title.
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(excluded):
        if t and detokenize_title(t) != t:
            groups.setdefault(t, []).append(i)
    for t, idx in groups.items():
        again = searcher.submit([q[i] for i in idx], k, exclude_titles=[detokenize_title(t)] * len(idx),
                                forbidden=set(forbidden) | {t}).result()
        for i, r in zip(idx, again):
            found[i] = r
    by_example = dict(zip(searched, found))
    results = [by_example[i] for i in lead]
    n_cand = [len(r) for r in results]
    notes = []
    for q, n in zip((queries[i] for i in lead), n_cand):
        if n >= k:
            notes.append("")
        elif not q.strip():
            notes.append(f"{n} of {k} candidates: the query (last {ell} tokens) is blank")
        else:
            notes.append(f"{n} of {k} candidates: the index has no more passages that match the query "
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


def shards_to_retrieve(layout: Layout) -> list[int]:
    build = layout.build
    return [s for s in range(build.n_shards) if not layout.retrieved(s).exists() and not layout.shard(s).exists()]


def run_retrieve(layout: Layout, model: str, ids: np.ndarray, samples: pa.Table, forbidden: set[str], batch: int,
                 verbose: bool = False) -> None:
    """Retrieve every shard that has no result file yet (the search process starts only if one is missing).

    The tokenizer (for decoding queries) is loaded here: a fast tokenizer must not be shared between
    this and the scoring thread."""
    build = layout.build
    todo = shards_to_retrieve(layout)
    if not todo:
        return
    tokenizer = load_tokenizer(model)
    searcher = open_searcher(build, verbose)
    try:
        atomic_write_json(layout.retrieval_info, {
            "index": build.retrieval.index, "fingerprint": searcher.fingerprint(), "num_docs": searcher.num_docs,
            "k1": build.retrieval.k1, "b": build.retrieval.b, "n_forbidden_titles": len(forbidden)})
        t0 = last = time.perf_counter()
        done = 0
        for j, s in enumerate(todo):
            r = build.shard_ids(s)
            table = retrieve_shard(searcher, build, tokenizer, ids, samples.slice(r.start, len(r)), forbidden, batch)
            atomic_write_parquet(layout.retrieved(s), table)
            done += len(r)
            now = time.perf_counter()
            if j == len(todo) - 1 or now - last > 30:
                last = now
                log(f"[retrieve] {j + 1}/{len(todo)} shard(s), {done:,} queries in {now - t0:.0f}s "
                    f"({done / max(now - t0, 1e-9):,.0f} queries/s)")
    finally:
        searcher.close()


class RetrieveThread(threading.Thread):
    """Runs :func:`run_retrieve` beside the scoring; a failure is written to ``work/retrieve.failed`` so that
    every rank waiting for a shard stops with its message instead of waiting forever."""
    def __init__(self, layout: Layout, *args, **kwargs):
        super().__init__(daemon=True, name="data_gen-retrieve")
        self.layout, self.args, self.kwargs = layout, args, kwargs
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            run_retrieve(self.layout, *self.args, **self.kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the waiting scorer
            self.error = e
            atomic_write_bytes(self.layout.retrieve_failed, str(e).encode())


def start_retrieve(layout: Layout, run: RunConfig, tokens, samples: pa.Table, forbidden: set[str], rank0: bool):
    """BM25 for the shards that lack it, on rank 0: now (``--stage retrieve``), or in a background
    thread that scoring waits on shard by shard (returned; None when there is nothing to retrieve)."""
    todo = shards_to_retrieve(layout)  # rank 0 retrieves them; other ranks wait for each shard they score
    if not todo:
        return None
    args = (layout, layout.build.model, tokens, samples, forbidden, run.retrieval_batch, run.verbose)
    if run.stage == "retrieve":
        if rank0:
            log(f"[retrieve] {len(todo)} shard(s), {len(forbidden):,} forbidden evaluation title(s)")
            run_retrieve(*args)
        return None
    layout.retrieve_failed.unlink(missing_ok=True)
    if not rank0:
        return None
    log(f"[retrieve] {len(todo)} shard(s) in the background, {len(forbidden):,} forbidden evaluation "
        "title(s); scoring starts with the first one")
    thread = RetrieveThread(*args)
    thread.start()
    return thread
