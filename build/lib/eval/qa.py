"""``python -m eval.qa``: open-domain QA with a frozen LM and a reranker (:mod:`ralm.open_qa`), exact match and F1.

    python -m demo.questions --world demo_out/world --out demo_out/qa/eval.jsonl        # the demo world's QA set
    python -m eval.qa --questions demo_out/qa/eval.jsonl --model smollm2-135m \\
        --retrieval.index demo_out/corpus/index --reranker bm25 --output_dir runs/qa/bm25
    python -m eval.qa --questions nq-test-dpr.json --model gpt2 --reranker none   # the reference's DPR layout

Retrieval happens once, by the question (BM25 top ``--retrieval.k``, or the file's own ``ctxs``); the
reranker picks one passage, which goes before ``Q: ...\\nA:``; the LM answers greedily up to
the first newline. Writes ``predictions.jsonl`` (question, gold, prediction, passage used, EM, F1) and
``results.json`` to ``--output_dir``.
"""

from __future__ import annotations

import sys

from ralm.cli import run
from ralm.settings import Ranker, Retrieval


def qa(questions: str, model: str = "gpt2", reranker: str = "bm25", retrieval: Retrieval = Retrieval(),
       ranker: Ranker = Ranker(), doc_max_tokens: int = 256, max_new_tokens: int = 16,
       output_dir: str | None = None, device: str | None = None, seed: int = 0, verbose: bool = False) -> dict:
    """Answer every question with one passage chosen by the reranker; exact match and F1.

    Args:
        questions: JSON list or JSON lines of {"question", "answers"} (optionally "ctxs", DPR layout).
        model: The frozen causal LM (python -m ralm.models list, a local directory or a hub id).
        reranker: none | bm25 | random | cosine | zero-shot | oracle | the path of a trained reranker.
        retrieval: BM25 index and k (unused where the file gives ctxs).
        ranker: Settings of rerankers with a model of their own (cosine, trained).
        doc_max_tokens: A passage is cut to this many LM tokens.
        max_new_tokens: Longest answer, in tokens.
        output_dir: Where predictions.jsonl and results.json go (default: runs/qa/<reranker>).
        device: cpu | cuda | cuda:N (default: cuda when available).
        seed: Seed of the random reranker.
        verbose: Show library and Java logging.
    """
    from eval.downstream import qa as work  # the LM, the reranker: seconds that --help does without

    return work(questions=questions, model=model, reranker=reranker, retrieval=retrieval, ranker=ranker,
                doc_max_tokens=doc_max_tokens, max_new_tokens=max_new_tokens, output_dir=output_dir, device=device,
                seed=seed, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return run(qa, argv, "python -m eval.qa", description=__doc__, after=lambda res, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
