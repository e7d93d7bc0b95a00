"""``python -m ralm.corpus``: any corpus as BM25 retrieves it, titled passages in a Lucene index.

    python -m ralm.corpus --text.file corpus.txt --out DIR        # articles, cut into 100-word passages
    python -m ralm.corpus --text.file passages.jsonl --out DIR    # Pyserini or BEIR records, as they are
    python -m ralm.corpus --text.file corpus.parquet --out DIR    # a parquet file or a saved HF dataset
    python -m ralm.corpus --text.file docs/ --out DIR             # a folder of .txt files (or of .jsonl)

The paper retrieves from DPR's Wikipedia passages (non-overlapping 100-word chunks, each with its article
title). Articles (raw WikiText layout with `` = Title = `` headings, plain text, one .txt file each, or a
Hugging Face text dataset) are cut the same way; records (JSONL with {"id", "contents"} or {"id"/"_id",
"title", "text"}, parquet, a dataset saved with save_to_disk) are passages already and keep their ids. The
format is told by the path (``--format`` to say it). Writes OUT/jsonl (Pyserini JsonCollection), OUT/index
(pass it as --retrieval.index) and, last, OUT/corpus.json (what was indexed). The work is
:func:`ralm.passages.index_corpus`'s.
"""

from __future__ import annotations

import sys

from ralm.cli import run
from ralm.settings import WIKITEXT103_TRAIN, Text


def corpus(out: str, text: Text = WIKITEXT103_TRAIN, format: str = "auto", fields: dict[str, str] | None = None,
           words: int = 100,
           threads: int | None = None, max_passages: int | None = None, max_heap: str | None = None,
           optimize: bool = False, jsonl_only: bool = False, verbose: bool = False) -> str:
    """Cut a corpus into titled, non-overlapping passages (or take its records as they are) and index them.

    Args:
        out: Output folder (gets jsonl/, index/ and corpus.json).
        text: The corpus: a file or folder of any format above, or a Hugging Face text dataset (WikiText-103
            train by default).
        format: auto (told by the path), text, jsonl, beir, tsv, csv, parquet, hf_disk or txt_dir.
        fields: The records' columns of id, title and text where they are not the usual names (id, _id, docid,
            pid; contents, text, passage, body; title), e.g. '{id: doc_no, text: passage_text}'.
        words: Words per passage (articles only).
        threads: Indexing threads (JSONL shards = threads; default: all cores).
        max_passages: Stop after this many passages (for demos).
        max_heap: JVM -Xmx for the indexer, e.g. 4g (default: Java's, 1/4 of RAM).
        optimize: Merge the index into one segment.
        jsonl_only: Write the JSONL passages but do not index them.
        verbose: Show the indexer's Java logging.
    """
    from ralm.passages import index_corpus  # datasets, pyarrow: a second of imports --help does without

    return index_corpus(out, text, format=format, fields=fields, words=words, threads=threads, max_passages=max_passages,
                        max_heap=max_heap, optimize=optimize, jsonl_only=jsonl_only, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return run(corpus, argv, "python -m ralm.corpus", description=__doc__,
               after=lambda msg, kw: print(msg, file=sys.stderr) or 0)


if __name__ == "__main__":
    sys.exit(main())
