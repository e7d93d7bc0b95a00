"""Corpora and texts as users have them: every format a ``--text.*`` or corpus input takes, read into documents.

A source is a path (or a Hugging Face hub dataset, :mod:`ralm.text`). Its format is told by ``format`` or, with
``auto``, by what the path is:

========== ================================================================ ==========================
format     what                                                             records
========== ================================================================ ==========================
text       raw WikiText layout (`` = Title = `` headings) or plain UTF-8 text  articles (cut into passages)
jsonl      Pyserini JsonCollection, ``{"id", "contents"}`` per line            passages, as they are
beir       BEIR / DPR, ``{"_id" or "id", "title", "text"}`` per line           passages, as they are
tsv        tab-separated: MS MARCO's ``id<TAB>text`` without a header, or a    passages, as they are
           header naming the id / title / text columns (DPR's psgs_w100.tsv)
csv        comma-separated with a header naming the id / title / text columns passages, as they are
parquet    a parquet file with id / title / text (or contents) columns       passages, as they are
hf_disk    a Hugging Face dataset saved with ``save_to_disk`` (same columns)  passages, as they are
txt_dir    a folder of ``.txt`` files (subfolders too), one document each,   articles (cut into passages)
           its file name without ``.txt`` the title
========== ================================================================ ==========================

A folder of ``*.jsonl`` files is read as one jsonl (or beir) source; jsonl, tsv and csv files may be
gzip-compressed (``.gz``), as BEIR and Pyserini corpora are shipped. Columns (and JSON keys) are found under
their usual names: the id as id, _id, docid, pid or doc_id; the text as text, contents, passage or body. :func:`read_documents` yields
:class:`Document` records of every format but text; :func:`as_wikitext` renders records as WikiText layout, so
that the LM can read any source as a text with articles and titles. A source that is none of these is one
:class:`~ralm.settings.InputError` naming the formats taken; a bad record names its file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ralm.errors import InputError

FORMATS = ("auto", "text", "jsonl", "beir", "tsv", "csv", "parquet", "hf_disk", "txt_dir")
#: Formats whose records are passages already (indexed as they are); the others are articles to cut.
PASSAGE_FORMATS = ("jsonl", "beir", "tsv", "csv", "parquet", "hf_disk")
TAKEN = ("a text file (raw WikiText layout or plain UTF-8), a .jsonl file or folder of them (Pyserini "
         '{"id","contents"} or BEIR {"_id","title","text"}), a .tsv file (id<TAB>text, or a header naming its '
         "id / title / text columns) or a .csv file with such a header (each also .gz), a .parquet file, a Hugging "
         "Face dataset saved with save_to_disk, or a folder of .txt files")
#: The usual names of a record's fields, first found wins.
#: The fields of a record a ``fields`` mapping may name (its column for each, where not a usual name).
FIELDS = ("id", "title", "text")
ID_KEYS = ("id", "_id", "docid", "pid", "doc_id")
TEXT_KEYS = ("contents", "text", "passage", "body")


@dataclass(frozen=True)
class Document:
    """One record of a source: its id, title ("" if none) and text."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """``title + "\\n" + text`` (a Pyserini passage's contents; retrieval reads the title back)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def detect(path: str | Path, flag: str = "--corpus.file") -> str:
    """The format of ``path`` (see the module's table); anything else is an :class:`InputError`."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{flag} {str(p)!r} does not exist; give {TAKEN}")
    if p.is_dir():
        if (p / "dataset_info.json").is_file() or (p / "state.json").is_file():
            return "hf_disk"
        if any(p.glob("*.jsonl")):
            return _jsonl_kind(sorted(p.glob("*.jsonl"))[0], flag)
        if any(p.rglob("*.txt")):
            return "txt_dir"
        raise InputError(f"{flag} {str(p)!r} is a folder with no .jsonl or .txt files and no saved dataset; give {TAKEN}")
    suffixes = [x.lower() for x in p.suffixes]
    suffix = suffixes[-2] if suffixes[-1:] == [".gz"] and len(suffixes) > 1 else p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _jsonl_kind(p, flag)
    if suffix in (".tsv", ".csv"):
        return suffix[1:]
    if suffix == ".parquet":
        return "parquet"
    with gzip.open(p, "rb") if p.suffix.lower() == ".gz" else open(p, "rb") as f:
        try:
            head = f.read(4096)
        except gzip.BadGzipFile:
            raise InputError(f"{flag} {str(p)!r} ends in .gz but is not gzip-compressed; give {TAKEN}") from None
    if head.startswith(b"PAR1"):
        return "parquet"
    if b"\0" in head:
        raise InputError(f"{flag} {str(p)!r} is a binary file, not text; give {TAKEN}")
    if head.lstrip().startswith(b"{"):
        return _jsonl_kind(p, flag)
    return "text"


def _open(path: Path, errors: str = "strict"):
    """A text file for reading, decompressed where it ends in .gz."""
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors=errors, newline="")
    return open(path, encoding="utf-8", errors=errors, newline="")


def _jsonl_kind(path: Path, flag: str) -> str:
    """``jsonl`` (Pyserini's id / contents) or ``beir`` (title / text), by the first record's keys."""
    try:
        with _open(path, errors="replace") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise InputError(f"{flag}: {path}:{i} is not JSON ({e.msg}); give {TAKEN}") from None
                    return "jsonl" if isinstance(row, dict) and "contents" in row else "beir"
    except (gzip.BadGzipFile, EOFError):
        raise InputError(f"{flag} {str(path)!r} ends in .gz but is not gzip-compressed (or is cut short)") from None
    raise InputError(f"{flag} {str(path)!r} holds no records")


def resolve_format(path: str | Path, format: str, flag: str) -> str:
    """``format``, or the detected one for ``auto``; an unknown name is an :class:`InputError`."""
    if format not in FORMATS:
        raise InputError(f"{flag.rsplit('.', 1)[0]}.format {format!r} is not one of {', '.join(FORMATS)}")
    return detect(path, flag) if format == "auto" else format


def read_text_file(path: str | Path, flag: str) -> str:
    """A UTF-8 text file's contents; a file that is not UTF-8 text is one :class:`InputError` naming it."""
    try:
        with _open(Path(path)) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise InputError(f"{flag} {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason}); convert it "
                         "(e.g. iconv -t utf-8) or give one of: " + TAKEN) from None


def read_documents(path: str | Path, format: str = "auto", flag: str = "--corpus.file",
                   fields: dict[str, str] | None = None) -> Iterator[Document]:
    """The records of a source of any format but ``text`` (see :func:`read_text_file` for that); ``fields`` names
    the columns of its id, title and text where they are not among the usual names (e.g. ``{id: pid, text:
    passage_text}``)."""
    fmt = resolve_format(path, format, flag)
    p = Path(path)
    fields = _check_fields(fields, fmt, flag)
    if fmt in ("jsonl", "beir"):
        yield from _jsonl_records(p, flag, fields)
    elif fmt in ("tsv", "csv"):
        yield from _delimited_records(p, fmt, flag, fields)
    elif fmt == "parquet":
        try:
            rows = pq.read_table(p).to_pylist()
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{flag} {str(p)!r} is not a readable parquet file ({' '.join(str(e).split())}); "
                             f"give {TAKEN}") from None
        yield from _table_records(rows, str(p), flag, fields)
    elif fmt == "hf_disk":
        from datasets import load_from_disk  # 1-2 s of imports, only for this format

        try:
            ds = load_from_disk(str(p))
        except (FileNotFoundError, ValueError) as e:
            raise InputError(f"{flag} {str(p)!r} is not a dataset saved with save_to_disk ({e})") from None
        if hasattr(ds, "keys") and not hasattr(ds, "column_names"):  # a DatasetDict: its first split
            ds = ds[next(iter(ds.keys()))]
        yield from _table_records(iter(ds), str(p), flag, fields)
    elif fmt == "txt_dir":
        files = sorted(p.rglob("*.txt")) if p.is_dir() else []
        if not files:
            raise InputError(f"{flag} {str(p)!r}: txt_dir needs a folder of .txt files")
        for f in files:  # in a subfolder, the id is the path below the folder (the title stays the file's name)
            yield Document(f.relative_to(p).with_suffix("").as_posix(), f.stem, read_text_file(f, flag))
    else:
        raise InputError(f"{flag} {str(p)!r} is a text, not a source of records; read it as text")


def _check_fields(fields: dict[str, str] | None, fmt: str, flag: str) -> dict[str, str] | None:
    if not fields:
        return None
    bad = sorted(set(fields) - set(FIELDS))
    if bad:
        raise InputError(f"{flag} fields {bad}: map any of {', '.join(FIELDS)} to a column name (e.g. {{id: pid, "
                         "text: passage_text}})")
    if fmt not in PASSAGE_FORMATS:
        raise InputError(f"{flag}: fields name columns of records; a {fmt} source has none (drop fields)")
    return {k: str(v) for k, v in fields.items()}


def _delimited_records(path: Path, fmt: str, flag: str, fields: dict[str, str] | None = None) -> Iterator[Document]:
    """TSV or CSV rows as records: a header naming the columns, or (TSV only) MS MARCO's ``id<TAB>text``."""
    csv.field_size_limit(sys.maxsize)  # passages longer than csv's 128 KiB default
    with _open(path) as f:
        try:
            reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",",
                                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
            first = next(reader, None)
            if first is None:
                raise InputError(f"{flag} {str(path)!r} holds no records")
            names = [c.strip().lower() for c in first]
            if fields:  # header names are read lower-case: so are the columns fields names
                fields = {k: v.lower() for k, v in fields.items()}
                named = all(v in names for v in fields.values())
            else:
                named = any(k in names for k in ID_KEYS) and any(k in names for k in TEXT_KEYS)
            if named:
                rows, start = reader, 2
            elif fmt == "tsv" and len(first) == 2 and not fields:  # MS MARCO collection.tsv: pid<TAB>passage
                names, rows, start = ["id", "text"], _chain(first, reader), 1
            else:
                raise InputError(f"{flag} {str(path)!r}: its first line {first[:5]} names no id and text columns "
                                 + (f"(fields {fields})" if fields else
                                    f"(ids: {', '.join(ID_KEYS)}; texts: {', '.join(TEXT_KEYS)})")
                                 + "; add a header line, or name its columns with fields: {id: ..., text: ...}"
                                 + (" (a TSV of exactly two columns needs none: id<TAB>text)" if fmt == "tsv" else ""))
            for i, row in enumerate(rows, start):
                if not row:
                    continue
                if len(row) != len(names):
                    raise InputError(f"{path}:{i} has {len(row)} {fmt.upper()} fields where the header has "
                                     f"{len(names)}")
                yield _record(dict(zip(names, row)), f"{path}:{i}", fields)
        except UnicodeDecodeError as e:
            raise InputError(f"{flag} {str(path)!r} is not UTF-8 text ({e.reason}); convert it to UTF-8") from None
        except (csv.Error, EOFError, gzip.BadGzipFile) as e:
            raise InputError(f"{flag} {str(path)!r} is not a readable {fmt.upper()} file ({e}; a .gz must be "
                             "gzip-compressed)") from None


def _chain(first: list[str], rest) -> Iterator[list[str]]:
    yield first
    yield from rest


def _jsonl_records(path: Path, flag: str, fields: dict[str, str] | None = None) -> Iterator[Document]:
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    for f in files:
        with _open(f) as lines:
            try:
                for i, line in enumerate(lines, 1):
                    if line.strip():
                        yield _record(_json(line, f, i), f"{f}:{i}", fields)
            except UnicodeDecodeError as e:
                raise InputError(f"{flag} {str(f)!r} is not UTF-8 text ({e.reason}); convert it to UTF-8") from None
            except (gzip.BadGzipFile, EOFError):
                raise InputError(f"{flag} {str(f)!r} is not gzip-compressed, or is cut short") from None


def _json(line: str, f: Path, i: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{f}:{i} is not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise InputError(f"{f}:{i} is a JSON {type(row).__name__}, not an object with an id and a text")
    return row


def _table_records(rows, where: str, flag: str, fields: dict[str, str] | None = None) -> Iterator[Document]:
    for i, row in enumerate(rows):
        yield _record(row, f"{where} row {i}", fields)


def _record(row: dict, where: str, fields: dict[str, str] | None = None) -> Document:
    """A Pyserini ({"id", "contents"}), BEIR ({"_id", "title", "text"}) or table row as a :class:`Document` (its
    fields under any of their usual names: :data:`ID_KEYS`, :data:`TEXT_KEYS`; or the columns ``fields`` names)."""
    if fields:
        missing = [f"{k} ({c!r})" for k, c in fields.items() if c not in row]
        if missing:
            raise InputError(f"{where} has no column for fields {', '.join(missing)}; it has {sorted(row)}")
        values = {k: row[c] for k, c in fields.items()}  # under the names read below; the usual ones give way
        usual = {"id": ID_KEYS, "text": TEXT_KEYS, "title": ("title",)}
        row = {k: v for k, v in row.items() if not any(k in usual[f] for f in values)} | values
    docid = next((row[k] for k in ID_KEYS if row.get(k) is not None), None)
    text_key = next((k for k in TEXT_KEYS if k in row), None)
    if docid is None or text_key is None:
        raise InputError(f"{where} needs an id ({', '.join(ID_KEYS)}) and a text ({', '.join(TEXT_KEYS)}; with "
                         f"\"title\" beside it, or the title on contents' first line); it has {sorted(row)}: name "
                         "its columns with fields, e.g. {id: doc_no, title: heading, text: passage_text}")
    if text_key == "contents":
        contents = str(row["contents"] or "")
        title, _, text = contents.partition("\n") if "\n" in contents else ("", "", contents)
        return Document(str(docid), title, text)  # as written: contents rebuilds the line byte for byte
    return Document(str(docid), str(row.get("title") or "").strip(), str(row[text_key] or ""))


def as_wikitext(docs) -> str:
    """Records rendered as raw WikiText layout (`` = Title = ``, a blank line, one paragraph per line), so that a
    text of any format has the articles and titles the LM's readers find (:mod:`ralm.articles`)."""
    out = []
    for d in docs:
        paras = [" ".join(p.split()) for p in d.text.split("\n") if p.strip()]
        if not paras:
            continue
        out.append(f" = {d.title or d.id} = \n \n" + "".join(f" {p} \n" for p in paras) + " \n")
    return "".join(out)
