"""Where the evaluation's candidates come from: a BM25 index or a reference retrieval file.

Both give, for every stride, the allowed passages in rank order, one chunk at a time. Index
retrieval runs in the search process (:mod:`ralm.search_process`): :meth:`IndexCandidates.prefetch`
submits the queries of the next chunks while the LM scores the current one, so on a GPU machine
retrieval overlaps scoring instead of preceding it. Each chunk's results are cached on disk, so a
resumed run does not search again. Either source can be written as the reference's JSON file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from eval.loop import Chunk, make_chunks
from ralm.articles import forbidden_titles
from ralm.files import check_writable, file_sha256
from ralm.progress import Progress
from ralm.retrieval import (
    RetrievalCache,
    index_identity,
    passages_from_reference,
    query_text,
    read_reference_json,
    reference_entry,
    write_reference_json,
)
from ralm.search_process import SearchProcess
from ralm.settings import InputError, Retrieval, Text, Windows
from ralm.stage import tokenize_text
from ralm.windows import Window


def reference_entries_for(windows: Sequence[Window], ids: Sequence[int], tokenizer, queries: Sequence[str],
                          passages: Sequence[Sequence]) -> list[dict]:
    """The reference retrieval file for these windows (``future`` = the targets' text)."""
    return [reference_entry(w.target_begin, w.end, tokenizer.decode(ids[w.target_begin:w.end]), q, p)
            for w, q, p in zip(windows, queries, passages)]



class FileCandidates:
    """Candidates read from a reference-format retrieval JSON file (checked against the windows)."""
    def __init__(self, path: str, windows: Sequence[Window], describe_settings: str):
        if not Path(path).is_file():
            raise InputError(f"--retrieval_file {path!r} does not exist")
        try:
            entries = read_reference_json(path)
        except (ValueError, OSError) as e:
            raise InputError(f"--retrieval_file {path!r} is not a reference retrieval JSON file: {e}") from None
        if len(entries) != len(windows):
            raise InputError(f"--retrieval_file {path} has {len(entries)} strides but the text gives {len(windows)} "
                             f"({describe_settings}): it was made for other settings or another text; regenerate "
                             "it or match the settings")
        for w, e in zip(windows, entries):
            if (e.get("begin_location"), e.get("end_location")) != (w.target_begin, w.end):
                raise InputError(f"--retrieval_file stride {w.index}: targets [{e.get('begin_location')}, "
                                 f"{e.get('end_location')}) but the text gives [{w.target_begin}, {w.end}); the file "
                                 "was made for other settings")
        self.entries = entries
        self.passages = passages_from_reference(entries)
        self.meta = {"source": "retrieval_file", "path": str(path), "sha256": file_sha256(path)}

    def queries(self, chunk: Chunk) -> list[str]:
        return [self.entries[w.index].get("query", "") for w in chunk.windows]

    def prefetch(self, chunk: Chunk) -> None:
        pass

    def get(self, chunk: Chunk) -> list[list]:
        return [self.passages[w.index] for w in chunk.windows]

    def close(self) -> None:
        pass


class IndexCandidates:
    """BM25 candidates from an index through the search process, prefetched and cached per chunk.

    The search process (and its JVM) starts only on the first chunk missing from the cache, so a second
    reranker evaluated on the same text starts no JVM at all.
    """
    def __init__(self, retrieval: Retrieval, ids: Sequence[int], tokenizer, forbidden: set[str], cache_dir: str | Path,
                 verbose: bool = False):
        self.retrieval, self.ids, self.tokenizer, self.forbidden = retrieval, ids, tokenizer, forbidden
        self.verbose = verbose
        self.cache = RetrievalCache(cache_dir)
        self._search = None
        self._futures: dict[int, tuple] = {}
        self._fingerprint = f"lucene|{index_identity(retrieval.index)}|k1={retrieval.k1!r}|b={retrieval.b!r}"
        self.meta = {"source": "index", "index": retrieval.index, "fingerprint": self._fingerprint,
                     "k1": retrieval.k1, "b": retrieval.b, "n_forbidden_titles": len(forbidden),
                     "query_tokens": retrieval.query_tokens}

    @property
    def search(self):
        if self._search is None:
            sp = SearchProcess(self.retrieval.index, k1=self.retrieval.k1, b=self.retrieval.b, verbose=self.verbose)
            if self.retrieval.k > sp.num_docs:
                sp.close()
                raise InputError(f"--retrieval.k {self.retrieval.k} is larger than the corpus: index "
                                 f"{self.retrieval.index!r} has only {sp.num_docs} passage(s). Lower --retrieval.k "
                                 "or use a larger index.")
            self.meta["num_docs"] = sp.num_docs
            self._search = sp
        return self._search

    def queries(self, chunk: Chunk) -> list[str]:
        return [query_text(self.tokenizer, self.ids, w.target_begin, self.retrieval.query_tokens)
                for w in chunk.windows]

    def _key(self, queries: list[str]) -> str:
        r = self.retrieval
        return self.cache.key(self._fingerprint, r.k1, r.b, r.k, queries, None, self.forbidden)

    def prefetch(self, chunk: Chunk) -> None:
        """Start searching ``chunk``'s queries (a no-op if cached or already submitted)."""
        if chunk.index in self._futures:
            return
        queries = self.queries(chunk)
        key = self._key(queries)
        if self.cache.get(key) is None:
            self._futures[chunk.index] = (key, self.search.submit(queries, self.retrieval.k, forbidden=self.forbidden))

    def get(self, chunk: Chunk) -> list[list]:
        """``chunk``'s candidates (waits for its search if it is still running)."""
        if chunk.index not in self._futures:
            key = self._key(self.queries(chunk))
            hit = self.cache.get(key)
            if hit is not None:
                return hit
            self.prefetch(chunk)
        key, fut = self._futures.pop(chunk.index)
        res = fut.result()
        self.cache.put(key, res)
        return res

    def close(self) -> None:
        if self._search is not None:
            self._search.close()


def write_retrieval_file(output: str, model: str, text: Text, retrieval: Retrieval, windows: Windows,
                         cache_dir: str | None, verbose: bool) -> str:
    """``python -m eval.retrieval_file``'s work: BM25 for every stride of ``text``, in the reference's JSON."""
    if not retrieval.index:
        raise InputError("--retrieval.index is required")
    if Path(output).is_dir():
        raise InputError(f"--output {output!r} is a directory; give the JSON file to write (e.g. {Path(output) / 'retrieval.json'})")
    check_writable(Path(output).parent, "--output's folder")
    tokens = tokenize_text(model, text, windows, documents=False)  # retrieval places no document
    retrieval.check_windows(windows, tokens.max_length)
    body, tok, ids, wins = tokens.body, tokens.tokenizer, tokens.ids, tokens.wins
    forbidden = forbidden_titles(body) if retrieval.forbid_eval_titles else set()
    with tempfile.TemporaryDirectory() as tmp:
        src = IndexCandidates(retrieval, ids, tok, forbidden, cache_dir or tmp, verbose=verbose)
        queries, passages = [""], [[]]
        try:
            chunks = make_chunks(wins, 256)[1:]
            with Progress(len(wins), "BM25", "queries") as bar:
                for i, c in enumerate(chunks):
                    for ahead in chunks[i:i + 3]:
                        src.prefetch(ahead)
                    queries += src.queries(c)
                    passages += src.get(c)
                    bar.update(len(c.windows))
        finally:
            src.close()
    write_reference_json(output, reference_entries_for(wins, ids, tok, queries, passages))
    return f"{len(wins)} strides, {len(forbidden)} forbidden titles, k={retrieval.k} -> {Path(output)}"
