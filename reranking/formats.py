"""``python -m reranking.formats``: a trained reranker in the ecosystem's formats.

    python -m reranking.formats --reranker runs/real/rerankers/bi-seed0 --out st-bi        # bi
    python -m reranking.formats --reranker demo_out/rerankers/cross/reranker --out ce     # cross

- A ``bi`` reranker becomes a sentence-transformers model directory (Transformer → mean Pooling →
  Normalize): ``SentenceTransformer(out).encode(texts)`` gives the project's embeddings, so
  ``cos(E(x), E(d)) / cosine_temperature`` is the reranker's score.
- A ``cross`` reranker becomes a Hugging Face sequence-classification directory with one label whose
  model is the project's own (encoder + linear head on the first token; no pooler, no tanh), shipped as
  code in the directory (``modeling_ralm_cross.py``): ``sentence_transformers.CrossEncoder(out,
  trust_remote_code=True).predict(pairs)`` and ``AutoModelForSequenceClassification.from_pretrained(out,
  trust_remote_code=True)`` give the project's scores for raw (prefix, passage) pairs: its tokenizer does not
  truncate, the model cuts each pair as the project does. (Hugging Face's built-in BERT/RoBERTa heads put a
  tanh layer before the label, which this model does not have.)

What the formats cannot hold is written into ``ralm_reranker.json`` beside them and printed: the BM25
prior (``bm25_weight``: add ``bm25_weight × BM25`` yourself), the bi-encoder's temperature, and the
truncation rule for prefixes (the project keeps a prefix's *last* ``max_prefix_tokens`` tokens, where the
ecosystem's tokenizers keep the first ones: both formats apply it inside the saved model).
"""

from __future__ import annotations

import sys

from ralm.cli import run


def convert(reranker: str, out: str) -> str:
    """Write a trained reranker in its ecosystem's format.

    Args:
        reranker: an export directory or a ``.ckpt`` of ``python -m reranking.fit``.
        out: the directory to write (created; an existing one is refused).
    """
    from reranking.interchange import convert as work  # torch, transformers: seconds that --help does without

    return work(reranker, out)


def main(argv: list[str] | None = None) -> int:
    return run(convert, argv, "python -m reranking.formats", description=__doc__,
               after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
