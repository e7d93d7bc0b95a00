"""Evaluation and training text, read exactly as the reference evaluation reads it (METHOD §2.1).

A local file may be of any format :mod:`ralm.documents` reads: a text file is read as is, records (JSONL,
parquet, a saved dataset, a folder of .txt files) become titled articles in raw WikiText layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import datasets

from ralm import hub
from ralm.documents import as_wikitext, detect, read_documents, read_text_file


def load_text(dataset: str = "wikitext", name: str | None = "wikitext-103-v1", split: str = "test",
              text_file: str | Path | None = None) -> str:
    """A whole split as one string.

    A local text file is read as is (records as WikiText-layout articles). A Hugging Face dataset's rows are
    concatenated with an empty row counting as ``" \\n"``, which reproduces the raw WikiText file byte for byte.
    """
    if text_file is not None:
        path = Path(text_file)
        if not path.exists():
            raise FileNotFoundError(f"file {str(path)!r} does not exist")
        fmt = detect(path, "--text.file")
        text = read_text_file(path, "--text.file") if fmt == "text" else as_wikitext(read_documents(path, fmt, "--text.file"))
    else:
        try:
            rows = _load_dataset(dataset, name, split)
        except Exception as e:  # datasets raises many types; the fix is the same
            raise ValueError(
                f"could not load dataset {dataset!r} (config {name!r}, split {split!r}): {e}\n"
                "Offline? Pass a local file (the .file setting, e.g. --text.file) instead."
            ) from e
        text = "".join(r["text"] if r["text"] else " \n" for r in rows)
    if not text.strip():
        raise ValueError(f"the text ({text_file or f'{dataset}/{name}/{split}'}) is empty")
    return text


def hf_lines(path: str = "wikitext", name: str | None = "wikitext-103-raw-v1", split: str = "train") -> Iterator[str]:
    """Stream the rows of a Hugging Face text dataset (column ``text``) as lines; an empty WikiText row is a
    blank line of the raw file, and rows are yielded as they are."""
    ds = _load_dataset(path, name, split)
    for batch in ds.iter(batch_size=10_000):
        yield from batch["text"]


def _load_dataset(path: str, name: str | None, split: str):
    """``datasets.load_dataset``, in the library's offline mode when the hub cannot be reached (ralm.hub)."""
    if hub.offline():
        datasets.config.HF_HUB_OFFLINE = True
    return datasets.load_dataset(path, name, split=split)


def word_count(text: str) -> int:
    """The reference's word-level normaliser: the number of ``" "`` characters (not a word split)."""
    return text.count(" ")
