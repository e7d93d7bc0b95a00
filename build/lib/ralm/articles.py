"""Text in raw WikiText layout: articles (`` = Title = `` level-1 headings), their titles and halves.

Every reader of the project finds articles the same way (:func:`split_articles`, :func:`iter_articles`): a
level-1 heading after a blank line starts one; text before the first heading is an article without a title.
The titles are what retrieval forbids (:func:`forbidden_titles`) and what the leak-free split cuts by
(:func:`article_halves`, :func:`hashed_below`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable, Iterator

import numpy as np

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


def hashed_below(keys, fraction: float, seed: int) -> np.ndarray:
    """Deterministic split by key: hash(seed, key) → [0, 1) < fraction, for each key (an id, a title); the same
    key always lands on the same side, whatever the order or the other keys."""
    return np.array([int.from_bytes(hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=8).digest(), "little")
                     / 2**64 < fraction for k in keys], dtype=bool)
