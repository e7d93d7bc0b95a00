"""Where the evaluation loop's candidates come from: a BM25 index or a reference retrieval file.

Both give, for every stride, the allowed passages in rank order. Index retrieval runs up front for
all strides (one ``batch_search`` per block, cached on disk) so the JVM's threads stay busy and the
scoring loop never waits on Lucene; the result can be saved in the reference's JSON format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from ralm.windows import Window, stride_windows


def reference_entries_for(windows: Sequence[Window], ids: Sequence[int], tokenizer, queries: Sequence[str],
                          passages: Sequence[Sequence]) -> list[dict]:
    """The reference retrieval file for these windows (``future`` = the targets' text)."""
    from ralm.retrieval import reference_entry

    return [reference_entry(w.target_begin, w.end, tokenizer.decode(ids[w.target_begin:w.end]), q, p)
            for w, q, p in zip(windows, queries, passages)]


def retrieve_all(windows: Sequence[Window], ids: Sequence[int], tokenizer, retriever, *, k: int,
                 query_tokens: int, forbidden=(), cache=None, block: int = 2048, progress: bool = True):
    """Queries (last ℓ tokens before each stride's targets) and their k allowed passages."""
    from ralm.retrieval import query_text

    queries = [query_text(tokenizer, ids, w.target_begin, query_tokens) if w.index > 0 else "" for w in windows]
    passages: list = []
    bar = tqdm(total=len(queries), desc="BM25", unit="query", disable=not progress)
    for start in range(0, len(queries), block):
        qs = queries[start:start + block]
        passages += (cache.search(retriever, qs, k, forbidden=forbidden) if cache is not None
                     else retriever.search(qs, k, forbidden=forbidden))
        bar.update(len(qs))
    bar.close()
    return queries, passages


def make_candidate_fn(cfg, text: str, ids: Sequence[int], tokenizer, max_length: int):
    """``(windows -> passages)`` for the loop, plus metadata recorded in results.json."""
    from ralm.retrieval import passages_from_reference, read_reference_json, write_reference_json

    windows = stride_windows(len(ids), cfg.stride, max_length)
    if cfg.retrieval_file:
        entries = read_reference_json(cfg.retrieval_file)
        if len(entries) != len(windows):
            raise ValueError(
                f"--retrieval-file {cfg.retrieval_file} has {len(entries)} strides but the text gives "
                f"{len(windows)} (stride {cfg.stride}, max length {max_length}): it was made for other "
                "settings or another text; regenerate it or match --stride/--max-length")
        for w, e in zip(windows, entries):
            if (e["begin_location"], e["end_location"]) != (w.target_begin, w.end):
                raise ValueError(
                    f"--retrieval-file stride {w.index}: targets [{e['begin_location']}, {e['end_location']}) "
                    f"but the text gives [{w.target_begin}, {w.end}); the file was made for other settings")
        passages = passages_from_reference(entries)
        meta = {"source": "retrieval_file", "path": str(cfg.retrieval_file)}
    else:
        from ralm.corpus import forbidden_titles
        from ralm.retrieval import BM25Retriever, RetrievalCache

        retriever = BM25Retriever(cfg.index, k1=cfg.k1, b=cfg.b)
        forbidden = forbidden_titles(text) if cfg.forbidden_titles else set()
        cache_dir = cfg.cache_dir or str(Path(cfg.output_dir).parent / "retrieval_cache")
        queries, passages = retrieve_all(windows, ids, tokenizer, retriever, k=cfg.k, query_tokens=cfg.query_tokens,
                                         forbidden=forbidden, cache=RetrievalCache(cache_dir))
        meta = {"source": "index", "index": cfg.index, "fingerprint": retriever.fingerprint(), "k1": retriever.k1,
                "b": retriever.b, "num_docs": retriever.num_docs, "n_forbidden_titles": len(forbidden),
                "query_tokens": cfg.query_tokens}
        if cfg.save_retrieval_file:
            write_reference_json(cfg.save_retrieval_file,
                                 reference_entries_for(windows, ids, tokenizer, queries, passages))
            meta["saved_retrieval_file"] = str(cfg.save_retrieval_file)

    def candidates(run: Sequence[Window]):
        return [passages[w.index] for w in run]

    return candidates, meta
