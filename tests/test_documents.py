"""Corpora as they are distributed (ralm.documents): one set of records written in every format, compressed or
not, read back as the same documents; columns under their usual names; folders with subfolders; and what is
not a corpus, refused in one line."""

from __future__ import annotations

import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ralm.documents import Document, detect, read_documents
from ralm.errors import InputError

DOCS = [Document("7", "Tempest", "Full fathom five, thy father lies;\tof his bones are coral made"),
        Document("8", "Lear", 'Nothing will come of nothing: "speak again"'),
        Document("9", "", "A passage with no title")]


def _write(path, text: str) -> None:
    (gzip.open(path, "wt", encoding="utf-8", newline="") if path.suffix == ".gz" else
     open(path, "w", encoding="utf-8", newline="")).write(text)


def _tsv(rows, header=None) -> str:
    clean = lambda s: s.replace("\t", " ")  # noqa: E731  (a TSV field holds no tab)
    return "".join("\t".join(map(clean, r)) + "\n" for r in ([header] if header else []) + rows)


def _csv(rows, header) -> str:
    import io

    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


@pytest.mark.parametrize("gz", [False, True])
def test_every_record_format_reads_back_the_same_documents(tmp_path, gz):
    ext = ".gz" if gz else ""
    no_tab = [Document(d.id, d.title, d.text.replace("\t", " ")) for d in DOCS]
    files = {
        "beir.jsonl": ("beir", "".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in DOCS), DOCS),
        "dpr.tsv": ("tsv", _tsv([[d.id, d.text, d.title] for d in DOCS], ["id", "text", "title"]), no_tab),
        "marco.tsv": ("tsv", _tsv([[d.id, d.text] for d in DOCS]), [Document(d.id, "", d.text) for d in no_tab]),
        "docs.csv": ("csv", _csv([[d.id, d.title, d.text] for d in DOCS], ["id", "title", "text"]), DOCS),
        "odd.csv": ("csv", _csv([[d.id, d.text, d.title] for d in DOCS], ["pid", "passage", "title"]), DOCS),
    }
    for name, (fmt, text, want) in files.items():
        path = tmp_path / (name + ext)
        _write(path, text)
        assert detect(path) == fmt, name
        assert list(read_documents(path)) == want, name


def test_a_folder_of_txt_files_reads_its_subfolders(tmp_path):
    (tmp_path / "plays" / "comedies").mkdir(parents=True)
    (tmp_path / "plays" / "lear.txt").write_text("Nothing will come of nothing.")
    (tmp_path / "plays" / "comedies" / "tempest.txt").write_text("Full fathom five.")
    got = list(read_documents(tmp_path / "plays"))
    assert got == [Document("comedies/tempest", "tempest", "Full fathom five."),
                   Document("lear", "lear", "Nothing will come of nothing.")]


def test_what_is_not_a_corpus_is_one_line(tmp_path):
    bad = tmp_path / "table.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="names no id and text columns .* add a header line"):
        list(read_documents(bad))
    three = tmp_path / "three.tsv"
    three.write_text("1\tx\ty\n")
    with pytest.raises(InputError, match="two columns needs none"):
        list(read_documents(three))
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("id\ttext\n1\tone\n2\ttwo\textra\n")
    with pytest.raises(InputError, match="ragged.tsv:3 has 3 TSV fields where the header has 2"):
        list(read_documents(ragged))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"id": "1", "contents": "x"}) + "\n")
    with pytest.raises(InputError, match="not a readable parquet file"):
        list(read_documents(jsonl, "parquet"))
    corrupt = tmp_path / "corrupt.parquet"
    pq.write_table(pa.table({"id": ["1"], "text": ["x"]}), corrupt)
    corrupt.write_bytes(corrupt.read_bytes()[:40])
    with pytest.raises(InputError, match="not a readable parquet file"):
        list(read_documents(corrupt))
    fake = tmp_path / "docs.jsonl.gz"
    fake.write_text("not gzip")
    with pytest.raises(InputError, match="not gzip-compressed"):
        list(read_documents(fake))


def test_columns_under_other_names_are_mapped_with_fields(tmp_path):
    """A parquet, CSV and JSONL whose columns have other names (doc_no, heading, passage_text) read as the same
    documents when ``fields`` names them; a named column that is missing, a field that is not id / title / text,
    or fields on a source without columns, one line each."""
    rows = [{"doc_no": d.id, "heading": d.title, "passage_text": d.text, "contents": "not this"} for d in DOCS]
    fields = {"id": "doc_no", "title": "heading", "text": "passage_text"}
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "odd.parquet")
    (tmp_path / "odd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write(tmp_path / "odd.csv", _csv([[d.id, d.title, d.text] for d in DOCS], ["Doc_No", "Heading", "Passage_Text"]))
    for name in ("odd.parquet", "odd.jsonl", "odd.csv"):
        assert list(read_documents(tmp_path / name, fields=fields)) == DOCS, name
    with pytest.raises(InputError, match="names no id and text columns"):  # without fields: refused, not guessed
        list(read_documents(tmp_path / "odd.csv"))
    with pytest.raises(InputError, match=r"no column for fields text \('body_text'\); it has \['contents', 'doc_no'"):
        list(read_documents(tmp_path / "odd.parquet", fields={"id": "doc_no", "text": "body_text"}))
    with pytest.raises(InputError, match=r"fields \['url'\]: map any of id, title, text"):
        list(read_documents(tmp_path / "odd.parquet", fields={"url": "doc_no"}))
    (tmp_path / "plain.txt").write_text("= A =\n\nsome text\n")
    with pytest.raises(InputError, match="a text source has none"):
        list(read_documents(tmp_path / "plain.txt", "text", fields=fields))
