"""In-Context RALM generation: a frozen causal LM writes, and every ``stride`` generated tokens the last
``query_tokens`` tokens query BM25, a reranker picks one of the top-``k`` passages, and the passage is
placed before the context for the next ``stride`` tokens.

The placement is evaluation's (:func:`ralm.scoring.condition_on_documents` on a window of
``max_length`` tokens ending where the stride ends; a row without a document starts as ``eval.ppl``'s do,
with one BOS for an LM whose tokenizer adds one, ``--windows.bos``): the LM reads ``[document ; context]`` with the
context cut from the left so that document + context + the stride fit in ``max_length``. On a context
of at least ``max_length`` tokens this is exactly the row ``eval.ppl`` scores; on a shorter one (a short
prompt) the document goes in front of the whole context instead of over its start. Within a stride the
document and the context's first token stay fixed, so the stride is decoded with the LM's key-value
cache (one ``generate`` call per stride for the whole batch, left-padded).

Rerankers: anything that does not need the LM's scores of the future — none, bm25, random, cosine, a
trained reranker (:func:`eval.rerankers.make_selector`). Zero-shot and oracle rank with LM forwards per
candidate and are not offered here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ralm.retrieval import query_text
from ralm.scoring import DocumentEncoder, input_device
from ralm.selectors import StrideBatch
from ralm.settings import Retrieval, SettingsError, Windows


@dataclass(frozen=True)
class Decoding:
    """How tokens are drawn: greedy by default; sampling draws from ``seed`` (the same prompts in the same
    batch give the same text); ``stop`` ends a continuation at its first occurrence (kept out of the text)."""
    max_new_tokens: int = 64
    sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"--max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if not self.temperature > 0:
            problems.append(f"--temperature must be > 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            problems.append(f"--top_p must be in (0, 1] (got {self.top_p})")
        if problems:
            raise SettingsError("invalid decoding settings: " + "; ".join(problems))


@dataclass
class Generation:
    """One prompt's continuation and the passages it was written with."""
    prompt: str
    text: str
    token_ids: list[int]
    #: One entry per stride: ``token`` (index in ``token_ids`` where the passage starts to count),
    #: ``query``, and the chosen passage's ``docid``, ``title``, ``rank`` in BM25's list (None: no passage).
    retrievals: list[dict] = field(default_factory=list)


def context_row(ids: Sequence[int], doc: Sequence[int] | None, end: int, max_length: int) -> list[int]:
    """What the LM reads before the first token of a stride whose last target is at ``end - 1``:
    ``[doc ; ids[c:len(ids)]]`` with ``c = max(0, end - (max_length - len(doc)))``.

    For ``end >= max_length`` this is ``condition_on_documents`` applied to the window
    ``ids[end - max_length:end]`` and cut before the stride's first target (tested).
    """
    doc = list(doc or [])[: max_length - (end - len(ids)) - 1]  # room for the stride and one context token
    begin = max(0, end - (max_length - len(doc)))
    return doc + list(ids[begin:])


def _stride_ids(lm, rows: list[list[int]], pad_id: int, new_tokens: int, decoding: Decoding, seed: int,
                eos: int | None) -> list[list[int]]:
    """``new_tokens`` tokens after each row, all rows in one left-padded ``generate`` call."""
    width = max(len(r) for r in rows)
    device = input_device(lm)
    input_ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    torch.manual_seed(seed)
    kwargs = ({"do_sample": True, "temperature": decoding.temperature, "top_p": decoding.top_p} if decoding.sample
              else {"do_sample": False})
    with torch.inference_mode():
        out = lm.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens if eos is None else 0, pad_token_id=pad_id,
                          eos_token_id=eos, top_k=None, **kwargs)
    new = out[:, width:].tolist()
    if eos is not None:  # cut after the first EOS (generate pads finished rows)
        new = [r[: r.index(eos) + 1] if eos in r else r for r in new]
    return new


def generate(lm, tokenizer, prompts: Sequence[str], selector, search=None, *, retrieval: Retrieval = Retrieval(),
             windows: Windows = Windows(), decoding: Decoding = Decoding(),
             on_tokens: Callable[[int, str], None] | None = None) -> list[Generation]:
    """Continue every prompt with retrieval every ``windows.stride`` tokens (batched over prompts).

    Args:
        lm, tokenizer: a frozen causal LM and its tokenizer (``ralm.loading.load_causal_lm``).
        selector: a :class:`ralm.selectors.Selector` that needs no LM scores.
        search: ``search(queries, k) -> list[list[Passage]]`` (a ``SearchProcess`` or ``BM25Retriever``);
            unused by ``none``.
        retrieval: ``k`` and ``query_tokens`` as in ``eval.ppl`` (the index is ``search``'s).
        windows: ``stride``, ``max_length`` (already fitted to the LM) and ``doc_max_tokens`` as in ``eval.ppl``.
        decoding: greedy or sampled, how many tokens, where to stop.
        on_tokens: called with (prompt index, new text) as each stride is written (streaming).
    """
    if selector.needs_lm_scores:
        raise ValueError(f"reranker {selector.name!r} ranks with LM scores of future tokens; generation offers "
                         "none, bm25, random, cosine and trained rerankers")
    if selector.uses_documents and search is None:
        raise ValueError(f"reranker {selector.name!r} needs a retriever (search)")
    stride, max_length = windows.stride, windows.max_length
    if not 1 <= stride < max_length:
        raise ValueError(f"stride must be in [1, max_length), got {stride}")
    docs = DocumentEncoder(tokenizer, windows.doc_max_tokens, bos=windows.bos)
    ids = [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]  # a row's BOS: from docs
    gens = [Generation(p, "", []) for p in prompts]
    live = list(range(len(prompts)))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = pad if pad is not None else (eos if eos is not None else 0)
    written = 0
    while live and written < decoding.max_new_tokens:
        s = min(stride, decoding.max_new_tokens - written)
        chosen = _choose(selector, search, tokenizer, [ids[b] for b in live], retrieval, s, max_length, written)
        doc_ids = docs([c.document() for c, _, _ in chosen if c is not None])
        it = iter(doc_ids)
        rows = [context_row(ids[b], next(it) if c is not None else docs.empty, len(ids[b]) + s, max_length)
                for b, (c, _, _) in zip(live, chosen)]
        new = _stride_ids(lm, rows, pad, s, decoding, decoding.seed * 1_000_003 + written, eos)
        for b, (c, rank, query), toks in zip(live, chosen, new):
            gens[b].retrievals.append({"token": len(gens[b].token_ids), "query": query, "rank": rank,
                                       "docid": c.docid if c else None, "title": c.title if c else None})
            ids[b] += toks
            gens[b].token_ids += toks
        written += s
        live = _still_live(live, gens, new, tokenizer, eos, decoding.stop, on_tokens, s)
    for g in gens:
        g.text = _final_text(tokenizer, g.token_ids, decoding.stop)
    return gens


def _choose(selector, search, tokenizer, contexts, retrieval: Retrieval, s, max_length, written):
    """(passage or None, its BM25 rank or None, the query) per context."""
    if not selector.uses_documents:
        return [(None, None, "") for _ in contexts]
    k = retrieval.k
    queries = [query_text(tokenizer, c, len(c), retrieval.query_tokens) for c in contexts]
    cands = [list(c[:k]) for c in search.search(queries, k)]
    prefixes = ([tokenizer.decode(c[max(0, len(c) + s - max_length):]) for c in contexts] if selector.reads_prefix
                else [""] * len(contexts))
    picks = selector.select(StrideBatch(prefix_texts=prefixes, candidates=cands, stride_ids=[written] * len(contexts)))
    return [(cands[i][p] if p >= 0 else None, p if p >= 0 else None, queries[i]) for i, p in enumerate(picks)]


def _still_live(live, gens, new, tokenizer, eos, stop, on_tokens, s) -> list[int]:
    keep = []
    for b, toks in zip(live, new):
        if on_tokens is not None:
            on_tokens(b, tokenizer.decode(toks))
        ended = (eos is not None and toks and toks[-1] == eos) or len(toks) < s
        if stop and stop in tokenizer.decode(gens[b].token_ids):
            ended = True
        if not ended:
            keep.append(b)
    return keep


def _final_text(tokenizer, token_ids: list[int], stop: str | None) -> str:
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return text.split(stop, 1)[0] if stop else text
