"""``python -m eval.generate``: In-Context RALM generation with a reranker (:mod:`ralm.generation`).

    python -m eval.generate --model smollm2-135m --retrieval.index runs/real/corpus/index \\
        --reranker runs/real/rerankers/bi_bm25-seed0 --prompt " = Robert Boulter = \\n \\n Robert Boulter is" \\
        --max_new_tokens 64 --windows.stride 16 --windows.max_length 256 --windows.doc_max_tokens 96
    python -m eval.generate --model gpt2 --retrieval.index IDX --reranker bm25 --prompts_file prompts.txt \\
        --sample true --seed 1 --stop "\\n" --out generations.jsonl

Every ``--windows.stride`` generated tokens the last ``--retrieval.query_tokens`` tokens query BM25, the
reranker picks one of the top ``--retrieval.k`` passages, and the passage goes before the context as in
``eval.ppl``. A single prompt streams to stdout; several are batched. ``--out`` gets one JSON line per
prompt: the prompt, the text, its token ids and, per stride, the query and the passage used with the
token at which it was retrieved.
"""

from __future__ import annotations

import sys

from ralm.cli import run
from ralm.settings import Ranker, Retrieval, Windows


def generate(prompt: str | None = None, prompts_file: str | None = None, model: str = "gpt2",
             reranker: str = "bm25", retrieval: Retrieval = Retrieval(), windows: Windows = Windows(),
             ranker: Ranker = Ranker(), max_new_tokens: int = 64, sample: bool = False, temperature: float = 1.0,
             top_p: float = 1.0, seed: int = 0, stop: str | None = None, batch_size: int = 8,
             out: str | None = None, device: str | None = None, verbose: bool = False) -> list[dict]:
    """Continue prompts with a frozen causal LM, retrieving and reranking every stride.

    Args:
        prompt: A prompt (``\\n`` stands for a newline); several go in ``prompts_file``.
        prompts_file: A file of prompts, one per line (``\\n`` inside a line stands for a newline).
        model: The frozen causal LM (python -m ralm.models list, a local directory or a hub id).
        reranker: none | bm25 | random | cosine | the path of a trained reranker (an export or a .ckpt).
        retrieval: BM25 index, k and query length.
        windows: Stride (tokens between retrievals), window L and document budget.
        ranker: Settings of rerankers with a model of their own (cosine, trained).
        max_new_tokens: Tokens to generate per prompt.
        sample: Sample (with temperature and top_p) instead of greedy decoding.
        temperature: Sampling temperature.
        top_p: Nucleus sampling mass.
        seed: Seed of sampling and of the random reranker.
        stop: End a continuation at this string (e.g. "\\n").
        batch_size: Prompts generated together.
        out: Write the generations as JSON lines here.
        device: cpu | cuda | cuda:N (default: cuda when available).
        verbose: Show library and Java logging.
    """
    from eval.downstream import generate as work  # the LM, the reranker: seconds that --help does without

    return work(prompt=prompt, prompts_file=prompts_file, model=model, reranker=reranker, retrieval=retrieval,
                windows=windows, ranker=ranker, max_new_tokens=max_new_tokens, sample=sample, temperature=temperature,
                top_p=top_p, seed=seed, stop=stop, batch_size=batch_size, out=out, device=device, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return run(generate, argv, "python -m eval.generate", description=__doc__, after=lambda rows, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
