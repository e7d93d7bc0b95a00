"""Rerankers as choosers on stored training examples no fit read (``python -m reranking.heldout``), with paired
intervals: the dev judge, where settings may be chosen because nothing evaluated is read.

    python -m pipeline --config RECIPE --until split      # split.heldout_fraction > 0 writes texts/train-heldout.txt
    python -m data_gen.build --config BUILD.yaml --text.file OUT/texts/train-heldout.txt ... --out heldout-data
    python -m reranking.heldout --data heldout-data --rerankers OUT/rerankers/* --by_article true

A fit validates on a few percent of its own shards, examples of the articles it trains on; examples of articles
no fit read are of the same kind, hundreds or thousands of them, and scoring them costs encoder passes only (the
LM's log p(y | d; x) of each candidate is stored). For each reranker the candidate it ranks first is "chosen";
the table gives the mean −log p(y | d; x) of the choice (nats per target), the share of the BM25-to-oracle gap
that captures, how often it is BM25's first, and paired bootstrap intervals (examples, or whole articles,
resampled) of its difference from BM25's first and from each baseline given with ``--against``.
"""

from __future__ import annotations

import sys

from ralm.cli import run
from ralm.settings import EncoderInput


def heldout(data: str, rerankers: list[str] | None = None, cosine: str | None = None,
            input: EncoderInput = EncoderInput(max_prefix_tokens=64, max_passage_tokens=128), k: int = 8,
            against: list[str] | None = None, out: str | None = None, device: str = "auto", batch_size: int = 64,
            by_article: bool = False, skip_missing: bool = False) -> str:
    """Judge rerankers on stored examples no fit read.

    Args:
        data: A data_gen.build output of examples no fit read (e.g. of the held-out training articles).
        rerankers: Export directories (reranking.fit --export_dir), each a row named by its directory.
        cosine: A sentence encoder (e.g. minilm-l6) as the row "cosine": untrained, reading ``input``.
        input: What the cosine row's encoder reads (a bi-encoder fit's --model.input, to compare with it).
        k: Candidates per example (the fits' --data.max_candidates).
        against: Row names each row is also compared with (e.g. an untrained start).
        out: Also write the table here (a .md), and its point estimates as JSON beside it (the same name, .json).
        device: Where the rerankers run: auto (cuda if present), cpu, cuda.
        batch_size: Encoder rows per forward (larger on a GPU).
        by_article: Resample whole source articles for the intervals (examples of one article are correlated).
        skip_missing: Leave out (with a line) rerankers not exported yet, e.g. a learning curve's fits still to
            run (the pipeline's judge stage on what is fitted so far); otherwise a missing one is an error.
    """
    from reranking.judging import judge  # the encoders, datasets: seconds that --help does without

    return judge(data, rerankers, cosine, input, k, against, out, device, batch_size, by_article, skip_missing)


def main(argv: list[str] | None = None) -> int:
    return run(heldout, argv, "python -m reranking.heldout", description=__doc__,
               after=lambda text, kw: print(text) or 0)


if __name__ == "__main__":
    sys.exit(main())
