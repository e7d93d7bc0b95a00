"""A trained reranker used where retrieval-augmented generation happens: generation and open-domain QA, the
work of ``python -m eval.generate`` and ``python -m eval.qa`` (the loops themselves are :mod:`ralm.generation`
and :mod:`ralm.open_qa`; the reranker comes from :mod:`eval.rerankers`, as in ``eval.ppl``).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from eval.rerankers import LM_RANKERS, check_reranker, make_selector
from ralm.cli import quiet_libraries
from ralm.files import atomic_write
from ralm.generation import Decoding
from ralm.generation import generate as ralm_generate
from ralm.loading import load_causal_lm
from ralm.open_qa import NO_DOC_PROMPT, PROMPT, answer, choose, contains_answer, exact_match, f1, read_questions
from ralm.retrieval import check_index
from ralm.scoring import context_length, input_device
from ralm.search_process import SearchProcess
from ralm.settings import InputError, Ranker, Retrieval, Scoring, Windows

#: QA rerankers that rank by the LM itself (no selector to build).
LM_RERANKERS = ("zero-shot", "oracle")


def generate(*, prompt: str | None, prompts_file: str | None, model: str, reranker: str, retrieval: Retrieval,
             windows: Windows, ranker: Ranker, max_new_tokens: int, sample: bool, temperature: float, top_p: float,
             seed: int, stop: str | None, batch_size: int, out: str | None, device: str | None,
             verbose: bool) -> list[dict]:
    """``python -m eval.generate``'s work: continue the prompts, retrieving and reranking every stride."""
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
    if reranker in LM_RANKERS:
        raise InputError(f"--reranker {reranker}: ranks with LM scores of future tokens and is not offered for "
                         "generation; use none, bm25, random, cosine or a trained reranker")
    uses_docs = check_reranker(reranker, ranker)
    if uses_docs and not retrieval.index:
        raise InputError(f"--reranker {reranker} needs --retrieval.index (a Lucene index of passages)")
    lm, tok = load_causal_lm(model, device)
    windows = replace(windows, max_length=windows.fitted(context_length(lm)))
    selector = make_selector(reranker, ranker, model, seed, windows=windows, max_length=windows.max_length,
                             scoring=Scoring()).to(input_device(lm))
    search = None
    if uses_docs:
        check_index(retrieval.index)
        search = SearchProcess(retrieval.index, k1=retrieval.k1, b=retrieval.b, verbose=verbose)
    return _Opened(lm, tok, selector, search, windows)


def _generate_batches(opened: _Opened, prompts, retrieval: Retrieval, decoding, batch_size: int) -> list[dict]:
    """Generations as JSON-ready rows; one prompt streams its text to stdout, several print a line each."""
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


def qa(*, questions: str, model: str, reranker: str, retrieval: Retrieval, ranker: Ranker, doc_max_tokens: int,
       max_new_tokens: int, output_dir: str | None, device: str | None, seed: int, verbose: bool) -> dict:
    """``python -m eval.qa``'s work: answer every question with one passage chosen by the reranker."""
    quiet_libraries(verbose)
    t0 = time.time()
    qs = read_questions(questions)
    out = Path(output_dir or f"runs/qa/{Path(reranker).name}")
    if reranker in LM_RANKERS and reranker not in LM_RERANKERS:
        raise InputError(f"--reranker {reranker}: not offered for question answering; use {' or '.join(LM_RERANKERS)} "
                         "(and none, for answers without a passage)")
    uses_docs = reranker in LM_RERANKERS or check_reranker(reranker, ranker)
    needs_search = uses_docs and any(q.ctxs is None for q in qs)
    if needs_search and not retrieval.index:
        raise InputError(f"--reranker {reranker} needs passages: pass --retrieval.index or questions with \"ctxs\"")
    lm, tok = load_causal_lm(model, device)
    selector = None
    if uses_docs and reranker not in LM_RERANKERS:
        selector = make_selector(reranker, ranker, model, seed, windows=Windows(), max_length=1024, scoring=Scoring())
    cands = _candidates(qs, retrieval, verbose) if needs_search else [q.ctxs for q in qs]
    budget = {}

    def doc_of(p) -> str:  # the passage cut to doc_max_tokens LM tokens, as text
        if p.docid not in budget:
            ids = tok(p.document(), max_length=doc_max_tokens, truncation=True, add_special_tokens=False)["input_ids"]
            budget[p.docid] = tok.decode(ids)
        return budget[p.docid]

    rows = []
    for i, (q, c) in enumerate(zip(qs, cands)):
        c = list(c or [])[: retrieval.k]
        pick = choose(q, c, reranker, selector, lm, tok, doc_of) if uses_docs else -1
        prompt = (PROMPT.format(document=doc_of(c[pick]), question=q.question) if pick >= 0
                  else NO_DOC_PROMPT.format(question=q.question))
        pred = answer(lm, tok, prompt, max_new_tokens)
        rows.append({"question": q.question, "answers": q.answers, "prediction": pred,
                     "passage": c[pick].docid if pick >= 0 else None, "rank": pick if pick >= 0 else None,
                     "em": exact_match(pred, q.answers), "f1": f1(pred, q.answers),
                     "contains": contains_answer(pred, q.answers)})
        if (i + 1) % 50 == 0 or i + 1 == len(qs):
            print(f"[eval.qa] {i + 1}/{len(qs)} questions, EM {sum(r['em'] for r in rows) / len(rows):.3f}",
                  file=sys.stderr, flush=True)
    return _write(out, rows, {"model": model, "reranker": reranker, "k": retrieval.k, "doc_max_tokens": doc_max_tokens,
                              "questions_file": str(questions), "seconds": round(time.time() - t0, 1)})


def _candidates(qs, retrieval: Retrieval, verbose: bool) -> list[list]:
    """BM25 top-k by the question, for the questions whose file gave no ctxs."""
    check_index(retrieval.index)
    asked = [q for q in qs if q.ctxs is None]  # a question whose file gave ctxs is not searched
    sp = SearchProcess(retrieval.index, k1=retrieval.k1, b=retrieval.b, verbose=verbose)
    try:
        hits = iter(sp.search([q.question for q in asked], retrieval.k))
    finally:
        sp.close()
    return [q.ctxs if q.ctxs is not None else next(hits) for q in qs]


def _write(out: Path, rows: list[dict], meta: dict) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    n = len(rows)
    results = {"questions": n, "exact_match": sum(r["em"] for r in rows) / n, "f1": sum(r["f1"] for r in rows) / n,
               "contains_answer": sum(r["contains"] for r in rows) / n,
               "with_passage": sum(r["passage"] is not None for r in rows) / n, **meta}
    atomic_write(out / "predictions.jsonl", lambda t: Path(t).write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)))
    atomic_write(out / "results.json", lambda t: Path(t).write_text(json.dumps(results, indent=1) + "\n"))
    print(f"{meta['reranker']}: EM {results['exact_match']:.3f}, F1 {results['f1']:.3f}, answer contained "
          f"{results['contains_answer']:.3f} on {n} questions -> {out}")
    return results
