"""The reference's way of evaluating, one window at a time: the baseline that bench/limit.py times.

    python bench/naive_eval.py --model DIR --text FILE                      # no retrieval
    python bench/naive_eval.py --model DIR --text FILE --retrieval-file F --ranking logprob --num-docs 16

What AI21Labs/in-context-ralm ``eval_lm.py`` computes, written out plainly and run as its own process
(start-up included, as a user would run it): the model as ``AutoModelForCausalLM.from_pretrained`` loads
it (GPT-2's own ``gelu_new``), for every stride one forward of its window (``num_docs`` rows when
documents are ranked, each document overwriting the window start), logits and cross-entropy at every
position, then the chosen row's targets. Prints one JSON line: NLL sum, scored tokens, loop seconds.
The same function is the in-process baseline of bench/eval_throughput.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

RANKINGS = ("none", "first", "logprob", "oracle")


def naive_nll(model, tokenizer, ids: Sequence[int], docs: Sequence[Sequence[str]], ranking: str, stride: int,
              max_length: int, doc_max_tokens: int = 256, rank_tokens: int = 16) -> tuple[float, int]:
    """(summed NLL, scored tokens) of the strided loop, one window per forward, full logits.

    docs[i]: the documents of stride i, best first (unused for "none"; stride 0 never gets one).
    ranking: none | first (the first document) | logprob (least NLL of the ``rank_tokens`` tokens before
    the targets) | oracle (least NLL of the targets).
    """
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
    device = next(model.parameters()).device
    ids = torch.as_tensor(list(ids), device=device)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    total, n_scored, prev_end = 0.0, 0, 0
    for i, begin in enumerate(range(0, len(ids), stride)):
        end = min(begin + max_length, len(ids))
        trg = end - prev_end
        window = ids[begin:end]
        use = [] if i == 0 or ranking == "none" else list(docs[i][:1] if ranking == "first" else docs[i])
        rows = window.repeat(max(1, len(use)), 1)
        for r, doc in enumerate(use):
            enc = tokenizer.encode(doc, max_length=doc_max_tokens, truncation=True)
            rows[r, :len(enc)] = torch.tensor(enc, device=device)
        with torch.no_grad():
            logits = model(rows).logits.float()  # every position, as the reference computes them
        nll = ce(logits[:, :-1].reshape(-1, logits.size(-1)), window[1:].repeat(len(rows))).view(len(rows), -1)
        best = 0
        if use and ranking == "logprob":
            best = int(torch.argmin(nll[:, -trg - rank_tokens:-trg].sum(1)))
        elif use and ranking == "oracle":
            best = int(torch.argmin(nll[:, -trg:].sum(1)))
        scored = nll[best] if i == 0 else nll[best, -trg:]
        total += float(scored.sum())
        n_scored += scored.numel()
        prev_end = end
        if end == len(ids):
            break
    return total, n_scored


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a local model directory (weights and tokenizer)")
    ap.add_argument("--text", required=True, help="the text file to evaluate")
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--retrieval-file", help="reference-format retrieval JSON (one entry per stride)")
    ap.add_argument("--ranking", choices=RANKINGS, default="none")
    ap.add_argument("--num-docs", type=int, default=16)
    ap.add_argument("--rank-tokens", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.model).eval().to(a.device)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    ids = tokenizer(Path(a.text).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    docs: list[list[str]] = []
    if a.retrieval_file:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from ralm.retrieval import passage_from_reference_doc  # title + "\n" + text, as the reference

        entries = json.loads(Path(a.retrieval_file).read_text(encoding="utf-8"))
        docs = [[passage_from_reference_doc(d).document() for d in e["retrieved_docs"][:a.num_docs]] for e in entries]
    elif a.ranking != "none":
        ap.error(f"--ranking {a.ranking} needs --retrieval-file")
    t = time.perf_counter()
    nll, n = naive_nll(model, tokenizer, ids, docs, a.ranking, a.stride, a.max_length, rank_tokens=a.rank_tokens)
    print(json.dumps({"nll_sum": nll, "n_scored_tokens": n, "loop_seconds": round(time.perf_counter() - t, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
