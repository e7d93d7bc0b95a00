"""``python -m data_gen.labeled_lists --data DATA --out OUT``: the LM-supervised training set for other trainers.

Writes ``OUT/train.parquet``, a Hugging Face dataset (``datasets.load_dataset("parquet",
data_files="OUT/train.parquet")``) in sentence-transformers' labeled-list layout: one row per example with
``query`` (the prefix x, as the reranker reads it), ``docs`` (its k candidates, BM25 order, ``"title\\ntext"``)
and ``labels`` (log p(y | d_j ; x) per candidate, the LM's supervision; never exponentiated), plus ``id``,
``target`` (y) and ``nodoc_logprob`` (log p(y | x)). A ``CrossEncoderTrainer`` with ``ListNetLoss`` trains on
it as it is: ListNet's softmax over the labels is the LM's posterior over the candidates (the LSR objective of
REPLUG and Atlas; the project's own losses are in :mod:`reranking.loss`). Pure pyarrow: no model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ralm.cli import run
from ralm.files import atomic_write
from ralm.settings import InputError

#: The training set's columns and the labeled-list names they take.
COLUMNS = {"id": "id", "prefix_text": "query", "doc_texts": "docs", "lm_logprobs": "labels",
           "target_text": "target", "nodoc_logprob": "nodoc_logprob"}


def labeled_lists(data: str, out: str, k: int | None = None) -> str:
    """Write a data_gen.build dataset as one labeled-list parquet file.

    Args:
        data: A finished data_gen.build output (its manifest.json and shards).
        out: The directory to write train.parquet (and labeled_lists.json, what it came from) into.
        k: Keep the first k candidates of each example (BM25 order; default: all).
    """
    d = Path(data)
    if not (d / "manifest.json").is_file():
        raise InputError(f"--data {data!r} has no manifest.json: give a finished data_gen.build output")
    manifest = json.loads((d / "manifest.json").read_text())
    shards = [d / s["file"] for s in manifest["shards"]]
    table = pa.concat_tables([pq.read_table(f, columns=list(COLUMNS)) for f in shards])
    table = table.rename_columns([COLUMNS[c] for c in table.column_names])
    if k is not None:
        if k < 1:
            raise InputError(f"--k must be >= 1 (got {k})")
        for col in ("docs", "labels"):
            table = table.set_column(table.column_names.index(col), col, pc.list_slice(table[col], 0, k))
    path = Path(out) / "train.parquet"
    atomic_write(path, lambda t: pq.write_table(table, t, compression="zstd"))
    record = {"source": str(d.resolve()), "content_hash": manifest["content_hash"], "examples": table.num_rows,
              "k": k, "labels": "log p(y | d; x) per candidate (natural log, summed over the target tokens)"}
    atomic_write(Path(out) / "labeled_lists.json", lambda t: Path(t).write_text(json.dumps(record, indent=2) + "\n"))
    return f"{table.num_rows:,} examples (query, docs, labels) -> {path}"


def main(argv: list[str] | None = None) -> int:
    return run(labeled_lists, argv, "python -m data_gen.labeled_lists", description=__doc__,
               after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
