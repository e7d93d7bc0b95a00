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
