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

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from ralm.settings import InputError, Ranker, Retrieval, Scoring, Windows


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
    from ralm.cli import quiet_libraries
    from ralm.generation import Decoding

    quiet_libraries(verbose)
    prompts = _read_prompts(prompt, prompts_file)
    decoding = Decoding(max_new_tokens=max_new_tokens, sample=sample, temperature=temperature, top_p=top_p,
                        seed=seed, stop=stop)
    opened = _open(model, reranker, retrieval, windows, ranker, seed, device, verbose)
    try:
        rows = _generate_batches(opened, prompts, retrieval, decoding, batch_size)
    finally:
        if opened.search is not None:
            opened.search.close()
    for r in rows:
        r.update(model=model, reranker=reranker)
    if out:
        from ralm.files import atomic_write

        atomic_write(Path(out), lambda t: Path(t).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                                     for r in rows)))
        print(f"[eval.generate] {len(rows)} generation(s) with their passages -> {out}", file=sys.stderr)
    return rows


def _read_prompts(prompt: str | None, prompts_file: str | None) -> list[str]:
    prompts = [prompt.replace("\\n", "\n")] if prompt else []
    if prompts_file:
        path = Path(prompts_file)
        if not path.is_file():
            raise InputError(f"--prompts_file {prompts_file!r} does not exist")
        prompts += [line.rstrip("\n").replace("\\n", "\n") for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise InputError("no prompt: pass --prompt TEXT or --prompts_file FILE (one prompt per line)")
    return prompts


class _Opened(NamedTuple):
    lm: object
    tok: object
    selector: object
    search: object  # a SearchProcess, or None for rerankers that use no documents
    windows: Windows  # L fitted to the LM


def _open(model, reranker, retrieval: Retrieval, windows: Windows, ranker: Ranker, seed, device, verbose) -> _Opened:
    """The LM, its tokenizer, the selector, the search process (None for ``none``) and the windows with L
    fitted to the LM; the reranker is refused before anything loads when generation cannot use it."""
    if reranker in ("zero-shot", "oracle"):
        raise InputError(f"--reranker {reranker}: ranks with LM scores of future tokens and is not offered for "
                         "generation; use none, bm25, random, cosine or a trained reranker")
    from eval.rerankers import check_reranker, make_selector
    from ralm.models import load_causal_lm
    from ralm.scoring import context_length, input_device

    uses_docs = check_reranker(reranker, ranker)
    if uses_docs and not retrieval.index:
        raise InputError(f"--reranker {reranker} needs --retrieval.index (a Lucene index of passages)")
    lm, tok = load_causal_lm(model, device)
    windows = replace(windows, max_length=windows.fitted(context_length(lm)))
    selector = make_selector(reranker, ranker, model, seed, windows=windows, max_length=windows.max_length,
                             scoring=Scoring()).to(input_device(lm))
    search = None
    if uses_docs:
        from ralm.retrieval import check_index
        from ralm.search_process import SearchProcess

        check_index(retrieval.index)
        search = SearchProcess(retrieval.index, k1=retrieval.k1, b=retrieval.b, verbose=verbose)
    return _Opened(lm, tok, selector, search, windows)


def _generate_batches(opened: _Opened, prompts, retrieval: Retrieval, decoding, batch_size: int) -> list[dict]:
    """Generations as JSON-ready rows; one prompt streams its text to stdout, several print a line each."""
    from ralm.generation import generate as ralm_generate

    stream = (lambda b, text: print(text, end="", flush=True)) if len(prompts) == 1 else None
    rows = []
    for i in range(0, len(prompts), batch_size):
        for g in ralm_generate(opened.lm, opened.tok, prompts[i:i + batch_size], opened.selector, opened.search,
                               retrieval=retrieval, windows=opened.windows, decoding=decoding, on_tokens=stream):
            rows.append({"prompt": g.prompt, "text": g.text, "token_ids": g.token_ids, "retrievals": g.retrievals})
            if stream is None:
                print(json.dumps({"prompt": g.prompt, "text": g.text}, ensure_ascii=False), flush=True)
    if stream is not None:
        print(flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(generate, argv, "python -m eval.generate", description=__doc__, after=lambda rows, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
