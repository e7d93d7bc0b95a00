"""The split stage: the texts the LM reads and the corpus retrieval searches, written where the commands find them.

A text read whole from a plain file (or a hub dataset) is read where it is and needs nothing here. Otherwise
this writes ``OUT/texts/NAME.txt`` in raw WikiText layout: a record source rendered as articles, a slice of
articles (``articles: [first, end]``), the second halves of the articles with ``split.halves`` (whose first
halves, of every text's file, become ``corpus.txt``), the training articles left after ``split.heldout_fraction``
(the others in ``train-heldout.txt``), and the corpus without its ``corpus.exclude`` documents. A text already
written with other contents is refused: the data and runs made from it would no longer match it.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from pipeline.plan import Recipe
from pipeline.recipe import Source
from ralm.articles import article_halves, hashed_below, split_articles
from ralm.documents import PASSAGE_FORMATS, Document, as_wikitext, read_documents, read_text_file, resolve_format
from ralm.files import atomic_write
from ralm.settings import InputError


def read_source(src: Source, flag: str) -> str:
    """A source's whole text in raw WikiText layout (records rendered as titled articles)."""
    if src.dataset:
        return src.text().load()
    fmt = resolve_format(src.file, src.format, flag)
    return (read_text_file(src.file, flag) if fmt == "text" else
            as_wikitext(read_documents(src.file, fmt, flag, src.fields)))


def titled_articles(text: str) -> list[tuple[str, str]]:
    """``(piece, title)`` of every titled article of a WikiText-layout text, in order."""
    return [(p, t) for p, t in zip(*split_articles(text)) if t]


def write_texts(r: Recipe) -> list[str]:
    """Write what the split stage owes the other stages; returns a line per file written or checked."""
    sources = r.texts.named()
    bodies: dict[str, str] = {}

    def body(name: str) -> str:
        key = _key(sources[name])
        if key not in bodies:
            bodies[key] = read_source(sources[name], f"texts.{name}.file")
        return bodies[key]

    out: dict[str, str] = {}
    halves = {}
    if r.split.halves:
        for name in sources:
            halves.setdefault(_key(sources[name]), article_halves(body(name)))
        out["corpus.txt"] = "".join(first for parts in halves.values() for _, first, _ in parts)
        if r.corpus.file:
            out["corpus.txt"] += _corpus_text(r)
    for name, src in sources.items():
        f = r.text_file(name)
        if f is None or f.parent != r.root / "texts":
            continue
        if r.split.halves:
            parts = halves[_key(src)]
            lo, hi = src.articles or (0, len(parts))
            text = "".join(second for _, _, second in parts[lo:hi])
        else:
            arts = titled_articles(body(name)) if src.articles else None
            text = "".join(p for p, _ in arts[src.articles[0]:src.articles[1]]) if arts is not None else body(name)
        if name == "train" and r.split.heldout_fraction:
            arts = titled_articles(text)
            held = hashed_below([t for _, t in arts], r.split.heldout_fraction, r.split.seed)
            out["train-heldout.txt"] = "".join(p for (p, _), h in zip(arts, held) if h)
            text = "".join(p for (p, _), h in zip(arts, held) if not h)
        if not text.strip():
            raise InputError(f"texts.{name}: no text left (check its articles range and the split settings)")
        out[f"{name}.txt"] = text
    if len(r.data.forbid) > 1:
        out["forbidden.txt"] = "".join(_read(r.text_file(n)) if n + ".txt" not in out else out[n + ".txt"]
                                       for n in r.data.forbid)
    corpus = r.corpus_file()
    if corpus is not None and corpus.parent == r.root / "texts" and not r.split.halves:
        out[corpus.name] = _excluded_corpus(r, corpus.suffix == ".jsonl")
    changed = [name for name, text in out.items() if (r.root / "texts" / name).is_file()
               and (r.root / "texts" / name).read_text(encoding="utf-8") != text]
    if changed:  # checked before anything is written: a refused run changes nothing
        raise InputError(f"{r.root / 'texts'}: {', '.join(changed)} exist(s) with other contents: the recipe's texts or "
                         "split settings changed since they were written, and what was made from them would no longer "
                         f"match. Use another --out, or delete {r.root} to start over")
    return [_write(r.root / "texts" / name, text) for name, text in out.items()]


def _key(src: Source) -> str:
    return src.file or f"{src.dataset}/{src.name}/{src.split}"


def _read(path: Path | None) -> str:
    return path.read_text(encoding="utf-8") if path is not None else ""


def _write(path: Path, text: str) -> str:
    if path.is_file():
        return f"{path}: unchanged"
    atomic_write(path, lambda t: Path(t).write_text(text, encoding="utf-8"))
    return f"{path}: {len(text):,} characters, {len(titled_articles(text)):,} articles"


def excluded(r: Recipe) -> set[str]:
    """The titles and ids the corpus leaves out."""
    names = set(r.corpus.exclude or [])
    if r.corpus.exclude_file:
        names |= {line.strip() for line in read_text_file(r.corpus.exclude_file, "corpus.exclude_file").splitlines()
                  if line.strip()}
    return names


#: What a document's title is, by corpus format (what corpus.exclude names).
TITLES = ("a WikiText-layout text: its ` = Title = ` heading; a folder of .txt files: each file's name without .txt; "
          "JSONL, BEIR, parquet or a saved dataset: each record's title field (and its id)")


def check_exclusions(drop: set[str], names: list[str | None], fmt: str) -> None:
    """Every excluded name must be some document's title or id: one that matches nothing would leave the document
    meant to go (a held-out text's duplicate: a leak) in the corpus without a word."""
    known = {n for n in names if n}
    missing = sorted(drop - known)
    if not missing:
        return

    def near(m: str) -> list[str]:
        return list(dict.fromkeys([n for n in sorted(known) if m.lower() in n.lower()][:3]
                                  + difflib.get_close_matches(m, known, n=3, cutoff=0.6)))[:3]
    said = "; ".join(f"{m!r} (near: {', '.join(map(repr, near(m))) or 'nothing'})" for m in missing[:5])
    raise InputError(f"corpus.exclude: {len(missing)} name(s) match no document of the corpus ({fmt}): {said}"
                     f"{' ...' if len(missing) > 5 else ''}. A title is {TITLES}; give titles or ids exactly")


def _corpus_text(r: Recipe) -> str:
    """The user's corpus as WikiText-layout articles, its excluded documents left out (to be cut into passages)."""
    fmt = resolve_format(r.corpus.file, r.corpus.format, "corpus.file")
    if fmt in PASSAGE_FORMATS:
        raise InputError(f"corpus.file {r.corpus.file!r} holds passages ({fmt}); with split.halves the corpus is "
                         "cut into passages, so give articles (text or a folder of .txt), or leave corpus.file out")
    return _excluded_corpus(r, False)


def _excluded_corpus(r: Recipe, passages: bool) -> str:
    """The corpus without the excluded documents: Pyserini JSONL records (``passages``) or WikiText-layout text."""
    drop = excluded(r)
    fmt = resolve_format(r.corpus.file, r.corpus.format, "corpus.file")
    if fmt == "text":
        text = read_text_file(r.corpus.file, "corpus.file")
        pieces, titles = split_articles(text)
        check_exclusions(drop, titles, fmt)
        return "".join(p for p, t in zip(pieces, titles) if not (t and t in drop))
    docs = list(read_documents(r.corpus.file, fmt, "corpus.file", r.corpus.fields))
    check_exclusions(drop, [x for d in docs for x in (d.id, d.title)], fmt)
    docs = [d for d in docs if d.id not in drop and d.title not in drop]
    if passages:
        return "".join(json.dumps({"id": d.id, "contents": d.contents}, ensure_ascii=False) + "\n" for d in docs)
    return as_wikitext(Document(d.id, d.title, d.text) for d in docs)
