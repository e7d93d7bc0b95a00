"""Evaluation and training text, read exactly as the reference evaluation reads it (METHOD §2.1)."""

from __future__ import annotations

from pathlib import Path


def load_text(dataset: str = "wikitext", name: str | None = "wikitext-103-v1", split: str = "test",
              text_file: str | Path | None = None) -> str:
    """A whole split as one string.

    A local file is read as is. A Hugging Face dataset's rows are concatenated with an empty row
    counting as ``" \\n"``, which reproduces the raw WikiText file byte for byte.
    """
    if text_file is not None:
        path = Path(text_file)
        if not path.is_file():
            raise FileNotFoundError(f"file {str(path)!r} does not exist")
        text = path.read_text(encoding="utf-8")
    else:
        from datasets import load_dataset

        try:
            rows = load_dataset(dataset, name, split=split)
        except Exception as e:  # datasets raises many types; the fix is the same
            raise ValueError(
                f"could not load dataset {dataset!r} (config {name!r}, split {split!r}): {e}\n"
                "Offline? Pass a local file (the .file setting, e.g. --text.file) instead."
            ) from e
        text = "".join(r["text"] if r["text"] else " \n" for r in rows)
    if not text.strip():
        raise ValueError(f"the text ({text_file or f'{dataset}/{name}/{split}'}) is empty")
    return text


def word_count(text: str) -> int:
    """The reference's word-level normaliser: the number of ``" "`` characters (not a word split)."""
    return text.count(" ")


def article_halves(text: str) -> list[tuple[str, str, str]]:
    """``(title, first half, second half)`` of every titled article of a raw-WikiText-layout text.

    Each half keeps the article's heading block (so both are titled like the article) and ends with a
    blank line, so that halves joined back to back keep WikiText's layout (a heading follows a blank
    line; without it ``ralm.corpus`` reads the next article's heading as text of this one). The cut
    falls between paragraphs, before the middle non-empty paragraph line. Articles with fewer than four
    paragraph lines are skipped (no half would be worth indexing or reading). The split behind the
    leak-free related corpora (docs/METHOD.md §5): index the first halves, read the second halves.
    """
    from data_gen.sample import split_articles

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
