"""The strided RALM perplexity loop of DESIGN §2, batched.

Reference semantics (AI21Labs/in-context-ralm ``eval_lm.py``), kept exactly: the same windows, the
same queries (only the past), documents overwriting the window start, zero-shot ranking on the s'
tokens before the targets, oracle on the targets, first minimum wins. What differs is only *how*
it is computed: strides of equal shape are stacked (with all their candidates) into a few large
forwards, and the LM head runs only on the positions that are scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ralm.scoring import DocumentEncoder, LMScorer, condition_on_documents
from ralm.selectors import Selector, StrideBatch
from ralm.windows import Window, stride_windows

if TYPE_CHECKING:
    from ralm.retrieval import Passage

CandidateFn = Callable[[list[Window]], "list[list[Passage]]"]  # windows -> allowed passages per stride


@dataclass
class LoopResult:
    """Everything the loop measured; perplexities are derived, never averaged."""

    n_tokens: int  # N: tokens in the text (the reference's token-level normaliser)
    stride_index: np.ndarray  # (S,) int
    stride_nll: np.ndarray  # (S,) float64 summed NLL of each stride's targets
    stride_n_tokens: np.ndarray  # (S,) int scored targets per stride
    chosen_rank: np.ndarray  # (S,) int BM25 rank of the chosen passage, -1 = none
    chosen_docid: list[str]  # (S,) "" = none
    n_candidates: np.ndarray  # (S,) int
    token_nll: np.ndarray  # (n_scored,) float32
    token_ids: np.ndarray  # (n_scored,) int target token ids
    token_stride: np.ndarray  # (n_scored,) int stride of each token
    extras: dict = field(default_factory=dict)

    @property
    def nll_sum(self) -> float:
        """Total NLL summed per stride; ``nll_sum_tokens`` is the same total summed per token."""
        return float(self.stride_nll.sum())

    @property
    def nll_sum_tokens(self) -> float:
        return float(self.token_nll.astype(np.float64).sum())

    def perplexity(self, count: int) -> float:
        return float(np.exp(self.nll_sum / count))


def _chunks(windows: Sequence[Window], size: int):
    """Consecutive runs of at most ``size`` windows of one shape (length, trg_len)."""
    run: list[Window] = []
    for w in windows:
        if run and (len(run) == size or (w.length, w.trg_len) != (run[0].length, run[0].trg_len)):
            yield run
            run = []
        run.append(w)
    if run:
        yield run


def run_loop(ids: Sequence[int], tokenizer, scorer: LMScorer, selector: Selector,
             candidates: CandidateFn | None = None, *, stride: int = 4, max_length: int = 1024,
             doc_max_tokens: int = 256, zero_shot_tokens: int = 16, k: int = 16, strides_per_chunk: int = 64,
             progress: bool = True) -> LoopResult:
    """Score every target token of ``ids`` with ``selector``'s choice of document per stride.

    candidates: maps a list of windows (index ≥ 1) to their allowed passages (rank order, at most
    ``k`` used). Required unless ``selector.uses_documents`` is False.
    """
    if selector.uses_documents and candidates is None:
        raise ValueError(f"the {selector.name!r} reranker needs retrieval: pass --index or --retrieval-file")
    ids_t = torch.as_tensor(list(ids), dtype=torch.long)
    windows = stride_windows(len(ids_t), stride, max_length)
    docs = DocumentEncoder(tokenizer, doc_max_tokens)
    rank_extra = zero_shot_tokens if selector.lm_ranking == "prefix" else 0

    S = len(windows)
    stride_nll = np.zeros(S, dtype=np.float64)
    stride_n = np.zeros(S, dtype=np.int64)
    chosen = np.full(S, -1, dtype=np.int64)
    chosen_docid = [""] * S
    n_cand = np.zeros(S, dtype=np.int64)
    tok_nll: list[np.ndarray] = []
    tok_ids: list[np.ndarray] = []
    tok_stride: list[np.ndarray] = []

    def record(w: Window, nll: torch.Tensor):
        stride_nll[w.index] = float(nll.double().sum())
        stride_n[w.index] = nll.numel()
        tok_nll.append(nll.numpy().astype(np.float32))
        tok_ids.append(ids_t[w.end - nll.numel():w.end].numpy())
        tok_stride.append(np.full(nll.numel(), w.index, dtype=np.int64))

    bar = tqdm(total=S, desc=f"ppl [{selector.name}]", unit="stride", disable=not progress)
    first = windows[0]  # scored whole, never with retrieval
    win0 = ids_t[first.begin:first.end].unsqueeze(0)
    record(first, scorer.nll(win0, win0, first.length - 1)[0])
    bar.update(1)

    for run in _chunks(windows[1:], strides_per_chunk):
        width, trg = run[0].length, run[0].trg_len
        wins = torch.stack([ids_t[w.begin:w.end] for w in run])  # (B, W)
        cands = ([c[:k] for c in candidates(run)] if selector.uses_documents else [[] for _ in run])
        prefixes = (tokenizer.batch_decode(wins[:, : width - trg].tolist()) if selector.reads_prefix
                    else [""] * len(run))
        batch = StrideBatch(prefix_texts=prefixes, candidates=cands, stride_ids=[w.index for w in run])
        n_score = trg + rank_extra
        if selector.needs_lm_scores and n_score >= width:
            raise ValueError(f"window of {width} tokens is too short to rank on {rank_extra} tokens before "
                             f"{trg} targets; lower --zero-shot-tokens or raise --max-length")

        if selector.needs_lm_scores:
            # Every candidate of every stride in one pass, stride by stride; a stride without
            # candidates gets one row without a document.
            owner, row_doc, first_row = [], [], []
            for b, c in enumerate(cands):
                first_row.append(len(owner))
                for d in (docs([p.document() for p in c]) if c else [None]):
                    owner.append(b)
                    row_doc.append(d)
            rows = wins[owner]  # (R, W)
            nll = scorer.nll(condition_on_documents(rows, row_doc), rows, n_score)  # (R, n_score)
            rank_sum = (nll[:, :rank_extra] if selector.lm_ranking == "prefix" else nll[:, rank_extra:]).sum(1)
            table = torch.full((len(run), max(1, max(len(c) for c in cands))), float("inf"))  # (B, k_max)
            for b, c in enumerate(cands):
                table[b, :len(c)] = rank_sum[first_row[b]:first_row[b] + len(c)]
            picks = selector.select(batch, table)
            for b, w in enumerate(run):
                p = picks[b]
                record(w, nll[first_row[b] + max(p, 0), rank_extra:])
                chosen[w.index] = p
        else:
            picks = selector.select(batch) if selector.uses_documents else [-1] * len(run)
            chosen_docs = docs([cands[b][p].document() for b, p in enumerate(picks) if p >= 0])
            it = iter(chosen_docs)
            row_doc = [next(it) if p >= 0 else None for p in picks]
            nll = scorer.nll(condition_on_documents(wins, row_doc), wins, trg)
            for b, w in enumerate(run):
                record(w, nll[b])
                chosen[w.index] = picks[b]
        for b, w in enumerate(run):
            n_cand[w.index] = len(cands[b])
            if chosen[w.index] >= 0:
                chosen_docid[w.index] = cands[b][chosen[w.index]].docid
        bar.update(len(run))
    bar.close()

    return LoopResult(
        n_tokens=len(ids_t), stride_index=np.arange(S), stride_nll=stride_nll, stride_n_tokens=stride_n,
        chosen_rank=chosen, chosen_docid=chosen_docid, n_candidates=n_cand,
        token_nll=np.concatenate(tok_nll), token_ids=np.concatenate(tok_ids), token_stride=np.concatenate(tok_stride),
    )
