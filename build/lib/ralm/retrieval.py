"""BM25 retrieval for In-Context RALM: queries from the past, exclusions, over-fetch, caching.

Behaviour follows the reference (AI21Labs/in-context-ralm ``sparse_retrieval.py``): the query is
the decoded last ℓ tokens *before* the targets; hits whose title is forbidden are skipped and
k allowed ones are kept; the document the LM reads is the stored ``contents`` verbatim
(``title\\ntext``; DPR stores ``"Title"\\ntext`` with quotes, and the reference conditions on that).
Results can be cached on disk and exported to / imported from the reference's retrieval JSON.

The JVM must be started by :func:`ralm.java.start_jvm` before Pyserini is imported; this module
does that itself, lazily, and refuses to search in a forked child (the JVM does not survive fork).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

from ralm.files import atomic_write
from ralm.java import jvm_pid, start_jvm
from ralm.settings import InputError

__all__ = [
    "Passage",
    "BM25Retriever",
    "query_text",
    "RetrievalCache",
    "parse_contents",
    "passage_from_reference_doc",
    "passage_to_reference_doc",
    "reference_entry",
    "passages_from_reference",
    "write_reference_json",
    "read_reference_json",
]


@dataclass(frozen=True)
class Passage:
    """One retrieved passage.

    ``title``/``text`` are parsed from the stored contents (title = first line, surrounding double
    quotes stripped) and serve exclusion and display. ``contents``, when set, is the exact stored
    string; :meth:`document` then returns it byte for byte, which is what the reference conditions on.
    """
    docid: str
    title: str
    text: str
    score: float
    contents: str | None = None

    def document(self) -> str:
        """The exact string the LM is conditioned on (before truncation to the document budget)."""
        if self.contents is not None:
            return self.contents
        return f"{self.title}\n{self.text}" if self.title else self.text


def parse_contents(contents: str) -> tuple[str, str]:
    """Split stored ``contents`` into ``(title, text)``: the first line is the title, quotes stripped.

    Contents without a newline have no title.
    """
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    if len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        head = head[1:-1]
    return head, rest


def query_text(tokenizer: Any, ids: Sequence[int], end: int, n_tokens: int) -> str:
    """The BM25 query for targets starting at ``end``: decode of ``ids[max(0, end - n_tokens):end]``.

    Only the past is used (the reference's ``_get_query_string`` with shift 0), so retrieval never
    sees the tokens it helps to predict.
    """
    if end < 0 or n_tokens < 0:
        raise ValueError(f"query_text: end and n_tokens must be >= 0, got end={end}, n_tokens={n_tokens}")
    window = ids[max(0, end - n_tokens) : end]
    if hasattr(window, "tolist"):
        window = window.tolist()
    return tokenizer.decode(list(window)) if len(window) else ""


def _segments_digest(index_dir: Path) -> str:
    """Hash of the newest ``segments_N`` file: changes whenever the index is rebuilt or modified."""
    segs = sorted(index_dir.glob("segments_*"), key=lambda p: int(p.name.split("_")[1], 36))
    if not segs:
        return "nosegments"
    return hashlib.sha256(segs[-1].read_bytes()).hexdigest()[:16]


def check_index(index: str | None, flag: str = "--retrieval.index") -> None:
    """Fail fast, without the JVM, on an index that is neither a Lucene index directory nor a plausible
    Pyserini prebuilt name."""
    if not index:
        raise InputError(f"{flag} is required: a Lucene index directory (python -m ralm.corpus) or a Pyserini "
                         "prebuilt index name")
    p = Path(index).expanduser()
    if (p.exists() or "/" in index or index.startswith(".")) and not (p.is_dir() and any(p.glob("segments_*"))):
        raise InputError(f"{flag} {index!r} is not a Lucene index directory (no segments_* file). Build one with "
                         "`python -m ralm.corpus --text.file TEXT --out DIR` and pass DIR/index, or pass a Pyserini "
                         "prebuilt index name such as 'wikipedia-dpr-100w'")


def index_identity(index: str) -> str:
    """What a search's results depend on in the index, computed without the JVM: a local index's path
    and the hash of its newest ``segments_N`` file (changes whenever it is rebuilt), or a prebuilt name."""
    path = Path(str(index)).expanduser()
    if path.is_dir():
        return f"dir:{path.resolve()}:{_segments_digest(path)}"
    return f"prebuilt:{index}"


class BM25Retriever:
    """Pyserini ``LuceneSearcher`` with BM25(k1, b) set explicitly, over a local index or a prebuilt one.

    ``index`` is an index directory (e.g. built by ``python -m ralm.corpus``) or a Pyserini prebuilt
    index name such as ``wikipedia-dpr-100w`` (downloaded on first use). The index must store raw
    documents (``-storeRaw``), since the passages' text is read back from it.
    """
    def __init__(self, index: str, k1: float = 0.9, b: float = 0.4, threads: int | None = None) -> None:
        start_jvm()
        from jnius import autoclass

        self.index = str(index)
        self.k1 = float(k1)
        self.b = float(b)
        self.threads = int(threads or os.cpu_count() or 1)
        #: First search depth with exclusions, as a multiple of k (then doubled where still short).
        self.overfetch = 2
        path = Path(self.index).expanduser()
        if not path.is_dir():
            # Pyserini's own (slow to import) code only to download a prebuilt index once.
            from pyserini.prebuilt_index_info import TF_INDEX_INFO

            if self.index not in TF_INDEX_INFO:
                raise ValueError(
                    f"{self.index!r} is neither an existing index directory nor a known Pyserini prebuilt Lucene "
                    "index name. Fix: pass a directory built with `python -m ralm.corpus --out DIR` (DIR/index) or "
                    "a prebuilt name such as 'wikipedia-dpr-100w'.")
            from pyserini.util import download_prebuilt_index

            try:
                path = Path(download_prebuilt_index(self.index, verbose=False))
            except Exception as e:  # noqa: BLE001 - network and archive errors alike
                raise ValueError(f"could not download the Pyserini prebuilt index {self.index!r} ({e}). Check the "
                                 "network, or pass a local index directory instead.") from None
        if not any(path.glob("segments_*")):
            raise ValueError(f"{self.index!r} is a directory but not a Lucene index (no segments_* file). "
                             "Build one with: python -m ralm.corpus --out DIR, then pass DIR/index.")
        # Anserini's searcher directly (what Pyserini's LuceneSearcher wraps): same hits, no torch import.
        self._searcher = autoclass("io.anserini.search.SimpleSearcher")(str(path))
        self._ident = index_identity(self.index)
        self._searcher.set_bm25(self.k1, self.b)
        self.num_docs: int = int(self._searcher.get_total_num_docs())
        if self.num_docs == 0:
            raise ValueError(f"index {self.index!r} contains no documents")
        doc = self._searcher.doc(0)  # Lucene-internal id 0
        if doc is None or doc.get("raw") is None:
            raise ValueError(
                f"index {self.index!r} stores no raw documents, so passages cannot be read back. "
                "Rebuild it with Anserini's -storeRaw (python -m ralm.corpus does this)."
            )
        self._jlist = autoclass("java.util.ArrayList")

    def fingerprint(self) -> str:
        """Identifies what the results depend on: index contents (path + segments hash, or prebuilt
        name), document count and BM25 parameters. Used in cache keys."""
        return f"lucene|{self._ident}|n={self.num_docs}|k1={self.k1!r}|b={self.b!r}"

    def _passage(self, hit: Any) -> Passage:
        raw = hit.lucene_document.get("raw")
        contents = json.loads(raw)["contents"]
        title, text = parse_contents(contents)
        return Passage(docid=str(hit.docid), title=title, text=text, score=float(hit.score), contents=contents)

    def search(
        self,
        queries: list[str],
        k: int,
        exclude_titles: Sequence[str | None] | None = None,
        forbidden: Collection[str] = (),
    ) -> list[list[Passage]]:
        """Top-``k`` allowed passages per query, best first.

        A hit is dropped if its title is in ``forbidden`` or equals ``exclude_titles[i]`` (the source
        article of training query i). Without exclusions ``k`` hits are fetched; with them, the depth
        starts at ``overfetch * k`` and doubles, for the queries still short of ``k`` only, until they
        have ``k`` or the corpus is exhausted. Lucene's ranking at depth d is a prefix of its ranking at
        2d (score, then docid), so the result equals filtering the full ranking whatever the depth; a
        shallow first depth only saves time (the reference always fetches 100). Empty queries get no
        passages.
        """
        if jvm_pid() != os.getpid():
            raise RuntimeError(
                "BM25Retriever.search called in a forked child of the process that started the JVM; "
                "the JVM does not survive fork (it would hang). Search in the main process."
            )
        n = len(queries)
        if exclude_titles is None:
            exclude_titles = [None] * n
        if len(exclude_titles) != n:
            raise ValueError(f"exclude_titles has {len(exclude_titles)} entries for {n} queries")
        if k <= 0:
            return [[] for _ in range(n)]
        forbidden = forbidden if isinstance(forbidden, (set, frozenset)) else set(forbidden)
        filtering = bool(forbidden) or any(t is not None for t in exclude_titles)
        out: list[list[Passage]] = [[] for _ in range(n)]
        todo = [i for i, q in enumerate(queries) if q and q.strip()]
        depth = min(max(k, int(self.overfetch * k)) if filtering else k, self.num_docs)
        while todo:
            jq, jid = self._jlist(), self._jlist()
            for i in todo:
                jq.add(queries[i])
                jid.add(str(i))
            res = self._searcher.batch_search(jq, jid, depth, self.threads)
            again = []
            for i in todo:
                hits = res.get(str(i)) or []
                kept: list[Passage] = []
                for hit in hits:
                    p = self._passage(hit)
                    if p.title in forbidden or (exclude_titles[i] is not None and p.title == exclude_titles[i]):
                        continue
                    kept.append(p)
                    if len(kept) == k:
                        break
                out[i] = kept
                if len(kept) < k and len(hits) >= depth and depth < self.num_docs:
                    again.append(i)
            todo = again
            depth = min(2 * depth, self.num_docs)
        return out

    def close(self) -> None:
        self._searcher.close()


# ----------------------------------------------------------------------------------------------
# Disk cache


def _passage_to_dict(p: Passage) -> dict:
    return asdict(p)


def _passage_from_dict(d: dict) -> Passage:
    return Passage(docid=d["docid"], title=d["title"], text=d["text"], score=float(d["score"]),
                   contents=d.get("contents"))


class RetrievalCache:
    """Retrieval results on disk as gzipped JSON (no pickle), one file per (call) key.

    The key hashes everything that determines the results: the retriever's fingerprint, k1, b, k,
    the queries in order, the per-query exclusions and the forbidden set. A different batch of the
    same queries is a different entry: callers should cache at a stable granularity (e.g. a shard).
    """
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(fingerprint: str, k1: float, b: float, k: int, queries: Sequence[str],
            exclude_titles: Sequence[str | None] | None = None, forbidden: Collection[str] = ()) -> str:
        material = json.dumps(
            {"fingerprint": fingerprint, "k1": float(k1), "b": float(b), "k": int(k), "queries": list(queries),
             "exclude_titles": None if exclude_titles is None else list(exclude_titles),
             "forbidden": sorted(forbidden)},
            ensure_ascii=False, sort_keys=True,
        )
        return hashlib.sha256(material.encode("utf-8")).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json.gz"

    def get(self, key: str) -> list[list[Passage]] | None:
        path = self._path(key)
        if not path.exists():
            return None
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        return [[_passage_from_dict(d) for d in row] for row in data["results"]]

    def put(self, key: str, results: list[list[Passage]]) -> None:
        def write(tmp: Path) -> None:
            with gzip.open(tmp, "wt", encoding="utf-8") as f:
                json.dump({"results": [[_passage_to_dict(p) for p in row] for row in results]}, f, ensure_ascii=False)

        atomic_write(self._path(key), write)  # a crash never leaves a half-written entry

    def search(self, retriever: BM25Retriever, queries: list[str], k: int,
               exclude_titles: Sequence[str | None] | None = None,
               forbidden: Collection[str] = ()) -> list[list[Passage]]:
        """``retriever.search`` through the cache (computed and stored on a miss)."""
        key = self.key(retriever.fingerprint(), retriever.k1, retriever.b, k, queries, exclude_titles, forbidden)
        hit = self.get(key)
        if hit is not None:
            return hit
        results = retriever.search(queries, k, exclude_titles=exclude_titles, forbidden=forbidden)
        self.put(key, results)
        return results


# ----------------------------------------------------------------------------------------------
# Reference retrieval JSON (AI21Labs/in-context-ralm prepare_retrieval_data.py / eval_lm.py)


def passage_from_reference_doc(doc: dict) -> Passage:
    """A reference ``retrieved_docs`` item as a :class:`Passage` whose ``document()`` is exactly what
    the reference eval conditions on.

    With a ``"title"`` key the reference uses ``title + "\\n" + text`` (just ``text`` if the title is
    empty); without one it uses ``text`` (the full stored contents), from which the title is parsed
    for exclusion while ``document()`` keeps the original string.
    """
    docid = str(doc.get("id", ""))
    score = float(doc.get("score", 0.0))
    if "title" in doc:
        return Passage(docid=docid, title=doc["title"], text=doc["text"], score=score)
    title, text = parse_contents(doc["text"])
    return Passage(docid=docid, title=title, text=text, score=score, contents=doc["text"])


def passage_to_reference_doc(p: Passage) -> dict:
    """Inverse of :func:`passage_from_reference_doc` (the reference writes ``{"text", "score"}``,
    ``text`` being the full contents; ``id`` is added only when the passage has one)."""
    doc: dict = {"text": p.contents} if p.contents is not None else {"title": p.title, "text": p.text}
    doc["score"] = p.score
    if p.docid:
        doc["id"] = p.docid
    return doc


def reference_entry(begin_location: int, end_location: int, future: str, query: str,
                    passages: Sequence[Passage]) -> dict:
    """One stride of the reference file: target span ``[begin_location, end_location)`` of the token
    stream, its decoded text (``future``), the query and the retrieved docs, best first."""
    return {"begin_location": int(begin_location), "end_location": int(end_location), "future": future,
            "query": query, "retrieved_docs": [passage_to_reference_doc(p) for p in passages]}


def passages_from_reference(entries: Sequence[dict]) -> list[list[Passage]]:
    """The ``retrieved_docs`` of every entry as passages (an entry without docs gives ``[]``)."""
    return [[passage_from_reference_doc(d) for d in e.get("retrieved_docs", [])] for e in entries]


def write_reference_json(path: str | Path, entries: Sequence[dict]) -> None:
    """Write entries as the reference does (``json.dumps(data, indent=4)`` plus a newline)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(list(entries), indent=4))
        f.write("\n")


def read_reference_json(path: str | Path) -> list[dict]:
    """Read a reference retrieval file (a JSON list of stride entries)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of stride entries, got {type(data).__name__}")
    return data
