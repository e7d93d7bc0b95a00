"""The training set's parquet schema: the contract between ``data_gen`` (writer) and ``reranking`` (reader).

One row per example: a prefix x of the training text, its next s tokens y, the BM25 candidates
d_1..d_k (rank order, the exact strings the LM was conditioned on) and log p_LM(y | d_j ; x) for each,
plus log p_LM(y | x) with no document.
"""

from __future__ import annotations

import pyarrow as pa

TRAINING_SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("source_title", pa.string()),
    ("position", pa.int64()),
    ("prefix_text", pa.string()),
    ("prefix_ids", pa.list_(pa.int32())),
    ("target_ids", pa.list_(pa.int32())),
    ("target_text", pa.string()),
    ("query", pa.string()),
    ("doc_ids", pa.list_(pa.string())),
    ("doc_titles", pa.list_(pa.string())),
    ("doc_texts", pa.list_(pa.string())),
    ("bm25_scores", pa.list_(pa.float32())),
    ("lm_logprobs", pa.list_(pa.float32())),
    ("nodoc_logprob", pa.float32()),
    ("n_candidates", pa.int32()),
    ("note", pa.string()),
])

#: What the reranker trainer reads (the others are for inspection and analysis).
TRAINING_COLUMNS = ("id", "prefix_text", "doc_texts", "lm_logprobs", "nodoc_logprob")
