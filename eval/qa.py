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

import json
import sys
import time
from pathlib import Path

from ralm.settings import InputError, Ranker, Retrieval, Scoring, Windows

LM_RERANKERS = ("zero-shot", "oracle")


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
    from eval.rerankers import check_reranker, make_selector
    from ralm.cli import quiet_libraries
    from ralm.models import load_causal_lm
    from ralm.open_qa import NO_DOC_PROMPT, PROMPT, answer, choose, contains_answer, exact_match, f1, read_questions

    quiet_libraries(verbose)
    t0 = time.time()
    qs = read_questions(questions)
    out = Path(output_dir or f"runs/qa/{Path(reranker).name}")
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
    from ralm.retrieval import check_index
    from ralm.search_process import SearchProcess

    check_index(retrieval.index)
    asked = [q for q in qs if q.ctxs is None]  # a question whose file gave ctxs is not searched
    sp = SearchProcess(retrieval.index, k1=retrieval.k1, b=retrieval.b, verbose=verbose)
    try:
        hits = iter(sp.search([q.question for q in asked], retrieval.k))
    finally:
        sp.close()
    return [q.ctxs if q.ctxs is not None else next(hits) for q in qs]


def _write(out: Path, rows: list[dict], meta: dict) -> dict:
    from ralm.files import atomic_write

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


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(qa, argv, "python -m eval.qa", description=__doc__, after=lambda res, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
