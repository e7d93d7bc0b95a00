"""Plain, obviously-correct transcriptions of the reference computations (AI21Labs/in-context-ralm
``eval_lm.py``), one example at a time, full logits, no batching. Tests compare the fast code to these."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def strided_nll(model, tok, ids, cands, strategy: str, *, stride: int, max_length: int, doc_max: int,
                s_prime: int = 16, seed: int = 0, row_bos: int | None = None) -> torch.Tensor:
    """Per-token NLL of every scored target of ``ids`` with ``strategy``'s document per stride.

    ``cands[i]``: the candidate passages of stride i (index 0 = first window, never retrieves).
    Documents are encoded like the reference: ``tok.encode(doc, max_length=doc_max, truncation=True)``
    (special tokens included) and overwrite the start of the window. ``row_bos``: a window read without a
    document has its first token replaced by this one (every row starting with one BOS; the reference: None).
    ``zero-shot-abstain`` / ``oracle-abstain``: as zero-shot / oracle, but the window without a document is
    ranked too and kept where its sum is no larger than every document's.
    """
    ids = torch.tensor(ids)
    N, nlls, prev_end = len(ids), [], 0
    for idx, begin in enumerate(range(0, N, stride)):
        end = min(begin + max_length, N)
        trg = end - prev_end
        window = ids[begin:end]
        docs = cands[idx] if idx > 0 and strategy != "none" else []
        if docs:
            if strategy == "bm25":
                use = [docs[0]]
            elif strategy == "random":
                use = [docs[int(np.random.default_rng([seed, idx]).integers(len(docs)))]]
            else:
                use = docs
            inp = window.repeat(len(use), 1)
            for j, d in enumerate(use):
                enc = tok.encode(d.document(), max_length=doc_max, truncation=True)
                inp[j, :len(enc)] = torch.tensor(enc)
            logits = model(inp).logits.float()
            tok_nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), window[1:].repeat(len(use)), reduction="none"
            ).view(len(use), -1)
            ranked = slice(-trg - s_prime, -trg) if strategy.startswith("zero-shot") else slice(-trg, None)
            if strategy in ("zero-shot", "oracle", "zero-shot-abstain", "oracle-abstain"):
                c = int(torch.argmin(tok_nll[:, ranked].sum(1)))
            else:
                c = 0
            nlls.append(tok_nll[c, -trg:])
            if strategy.endswith("-abstain"):
                plain = _no_document(model, window, row_bos)
                if float(plain[ranked].sum()) <= float(tok_nll[c, ranked].sum()):
                    nlls[-1] = plain[-trg:]
        else:
            tok_nll = _no_document(model, window, row_bos)
            nlls.append(tok_nll[-trg:] if trg < len(window) else tok_nll)
        prev_end = end
        if end == N:
            break
    return torch.cat(nlls).double()


def _no_document(model, window: torch.Tensor, row_bos: int | None) -> torch.Tensor:
    """Per-token NLL of the window read without a document (its first token a BOS where ``row_bos``)."""
    inp = window.clone()
    if row_bos is not None:
        inp[0] = row_bos
    logits = model(inp[None]).logits.float()
    return torch.nn.functional.cross_entropy(logits[0, :-1], window[1:], reduction="none")


@torch.no_grad()
def zero_shot_pick(model, tok, prefix_text: str, docs: list[str], *, rank_tokens: int, doc_max: int,
                   max_length: int) -> int:
    """A separate ranking LM's choice, one candidate at a time: the prefix re-tokenized with *its*
    tokenizer (no special tokens) and cut from the left to ``max_length``; each document (encoded with
    special tokens, cut to ``doc_max``) overwrites the start; smallest NLL of the last ``rank_tokens``."""
    ids = tok(prefix_text, add_special_tokens=False)["input_ids"][-max_length:]
    best, best_nll = 0, float("inf")
    for j, d in enumerate(docs):
        seq = list(ids)
        enc = tok.encode(d, max_length=doc_max, truncation=True)
        seq[:len(enc)] = enc[:len(seq)]
        logits = model(torch.tensor([seq])).logits[0].float()
        nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
        s = float(nll[-rank_tokens:].sum())
        if s < best_nll:
            best, best_nll = j, s
    return best


@torch.no_grad()
def target_logprob(model, tok, ids, position: int, doc: str | None, *, stride: int, max_length: int,
                   doc_max: int) -> float:
    """log p(ids[p:p+s] | doc ; prefix) for a training example: ``[doc ; prefix cut from the left ; y]``."""
    d = [] if doc is None else tok.encode(doc, max_length=doc_max, truncation=True)
    seq = d + list(ids[position + stride - (max_length - len(d)):position + stride])
    assert len(seq) == max_length
    return last_tokens_logprob(model, seq, stride)


def last_tokens_logprob(model, seq: list[int], s: int) -> float:
    """log p of the last ``s`` tokens of ``seq`` given the tokens before them: one plain forward."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)
    n = len(seq)
    return sum(float(logp[n - s - 1 + i, seq[n - s + i]]) for i in range(s))
