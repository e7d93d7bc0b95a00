"""The strided RALM perplexity loop of METHOD §2, batched, one chunk of strides at a time.

Reference semantics (AI21Labs/in-context-ralm ``eval_lm.py``), kept exactly: the same windows, the
same queries (only the past), documents overwriting the window start, zero-shot ranking on the s'
tokens before the targets, oracle on the targets, first minimum wins. What differs is only *how*
it is computed: a chunk (consecutive strides of equal shape, with all their candidates) goes through
a few large forwards, and the LM head runs only on the positions that are scored.

:func:`score_chunk` is the unit of work: ``eval.predict`` runs it as a Lightning predict step (one
device, many, several nodes) and persists each chunk's result (``eval.predict.run_loop`` is that path
in one call, for tests and benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from ralm.scoring import DocumentEncoder, LMScorer
from ralm.selectors import Selector, StrideBatch
from ralm.settings import SettingsError
from ralm.windows import Window

if TYPE_CHECKING:
    from eval.reuse import ReusedScores
    from ralm.retrieval import Passage

CandidateFn = Callable[[list[Window]], "list[list[Passage]]"]  # windows -> allowed passages per stride


@dataclass(frozen=True)
class Chunk:
    """Consecutive windows of one shape, scored together; chunk 0 is the first window alone."""

    index: int
    windows: tuple[Window, ...]


def make_chunks(windows: Sequence[Window], size: int) -> list[Chunk]:
    """The first window alone (scored whole, never with retrieval), then runs of at most ``size``
    consecutive windows of one shape (length, trg_len). A pure function of its inputs, so a resumed run
    cuts the same chunks."""
    chunks = [Chunk(0, (windows[0],))]
    run: list[Window] = []
    for w in windows[1:]:
        if run and (len(run) == size or (w.length, w.trg_len) != (run[0].length, run[0].trg_len)):
            chunks.append(Chunk(len(chunks), tuple(run)))
            run = []
        run.append(w)
    if run:
        chunks.append(Chunk(len(chunks), tuple(run)))
    return chunks


@dataclass(frozen=True)
class ChunkInput:
    """What a chunk is scored from besides the token stream: per stride, the allowed passages in rank
    order and the decoded window tokens before the targets ("" when the selector does not read them)."""
    chunk: Chunk
    candidates: list[list["Passage"]]
    prefix_texts: list[str]


@dataclass
class ChunkResult:
    """What one chunk measured (arrays over its strides ``B`` and scored tokens ``T``)."""

    stride_index: np.ndarray  # (B,) int64
    stride_nll: np.ndarray  # (B,) float64 summed NLL of each stride's targets
    stride_n_tokens: np.ndarray  # (B,) int64
    chosen_rank: np.ndarray  # (B,) int64, -1 = no document
    n_candidates: np.ndarray  # (B,) int64
    token_nll: np.ndarray  # (T,) float32
    reused: np.ndarray  # (B,) bool, target NLLs taken from an earlier run (eval.reuse)
    chosen: list  # (B,) the chosen Passage or None
    # Every candidate's target NLLs, where the LM scored them all to choose (zero-shot, oracle): rows R,
    # each a stride and a docid ("" = no document); what later runs reuse instead of a forward (eval.reuse).
    cand_stride: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (R,)
    cand_docid: list = field(default_factory=list)  # (R,) str
    cand_n_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (R,)
    cand_nll: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # (sum of cand_n_tokens,)


def score_chunk(ids: torch.Tensor, item: ChunkInput, scorer: LMScorer, selector: Selector, docs: DocumentEncoder,
                *, zero_shot_tokens: int, k: int, reuse: "ReusedScores | None" = None) -> ChunkResult:
    """Choose a document per stride of ``item.chunk`` and score its targets.

    ids: (N,) long, the whole token stream; item: the chunk with its candidates (at most ``k`` used) and
    prefix texts; reuse: target NLLs an earlier run computed for the same LM inputs.
    """
    run = list(item.chunk.windows)
    if item.chunk.index == 0:  # the first window: scored whole with no retrieval
        w = run[0]
        win = ids[w.begin:w.end].unsqueeze(0)
        return _chunk_result(run, [[]], [-1], [(scorer.nll(docs.condition(win, [None]), win, w.length - 1)[0], False)])
    wins = torch.stack([ids[w.begin:w.end] for w in run])  # (B, W)
    cands = [list(c[:k]) for c in item.candidates] if selector.uses_documents else [[] for _ in run]
    batch = StrideBatch(prefix_texts=item.prefix_texts, candidates=cands, stride_ids=[w.index for w in run])
    if selector.needs_lm_scores:
        rank_extra = zero_shot_tokens if selector.lm_ranking == "prefix" else 0
        return _choose_by_lm(wins, cands, batch, scorer, selector, docs, run, rank_extra,
                             reuse if selector.lm_ranking == "targets" else None)
    picks = selector.select(batch) if selector.uses_documents else [-1] * len(run)
    return _chunk_result(run, cands, picks, _target_nll(wins, cands, picks, run, scorer, docs, reuse))


def _target_nll(wins: torch.Tensor, cands: list[list["Passage"]], picks: Sequence[int], run: list[Window],
                scorer: LMScorer, docs: DocumentEncoder,
                reuse: "ReusedScores | None") -> list[tuple[torch.Tensor, bool]]:
    """Each stride's target NLL under its pick and whether it was reused: from ``reuse`` where an earlier
    run chose the same passage for the stride, the rest in one batched LM pass."""
    trg = run[0].trg_len
    got = [reuse.get(w.index, cands[b][p].docid if p >= 0 else "", trg) if reuse else None
           for b, (w, p) in enumerate(zip(run, picks))]
    todo = [b for b, g in enumerate(got) if g is None]
    if todo:
        chosen_docs = iter(docs([cands[b][picks[b]].document() for b in todo if picks[b] >= 0]))
        row_doc = [next(chosen_docs) if picks[b] >= 0 else None for b in todo]
        rows = wins[todo]
        computed = iter(scorer.nll(docs.condition(rows, row_doc), rows, trg))
    return [(g, True) if g is not None else (next(computed), False) for g in got]


def check_ranking_window(length: int, rank_tokens: int, targets: int) -> None:
    """Zero-shot ranks on the ``rank_tokens`` before the ``targets``: both must fit in the window."""
    if targets + rank_tokens >= length:
        raise SettingsError(f"a window of {length} tokens is too short to rank on {rank_tokens} tokens "
                            f"before {targets} targets; lower --windows.zero_shot_tokens or raise --windows.max_length")


def _choose_by_lm(wins: torch.Tensor, cands: list[list["Passage"]], batch: StrideBatch, scorer: LMScorer,
                  selector: Selector, docs: DocumentEncoder, run: list[Window], rank_extra: int,
                  reuse: "ReusedScores | None") -> ChunkResult:
    """Zero-shot and oracle: every candidate of every stride in one LM pass, stride by stride (a stride
    without candidates gets one row without a document, and so does every stride for a selector that
    ``abstains``, first); the selector picks from the LM's sums over the ranking tokens. The oracle ranks on
    the targets alone, so a row an earlier run scored (``reuse``, e.g. the zero-shot run's table, a none run's
    windows) needs no forward. Every row's target NLLs go into the result."""
    trg = run[0].trg_len
    n_score = trg + rank_extra
    check_ranking_window(wins.shape[1], rank_extra, trg)
    off = int(selector.abstains)  # rows (and lm_nll columns) before a stride's candidates: its no-passage row
    owner, row_passage, first_row = [], [], []
    for b, c in enumerate(cands):
        first_row.append(len(owner))
        for p in ([None] * off + c if c else [None]):
            owner.append(b)
            row_passage.append(p)
    row_docid = [p.docid if p is not None else "" for p in row_passage]
    got = [reuse.get(run[b].index, d, trg) if reuse else None for b, d in zip(owner, row_docid)]
    todo = [r for r, g in enumerate(got) if g is None]
    nll = torch.empty(len(owner), n_score)  # (R, n_score)
    for r, g in enumerate(got):
        if g is not None:
            nll[r] = g
    if todo:
        encoded = iter(docs([row_passage[r].document() for r in todo if row_passage[r] is not None]))
        rows = wins[[owner[r] for r in todo]]
        row_doc = [next(encoded) if row_passage[r] is not None else None for r in todo]
        nll[todo] = scorer.nll(docs.condition(rows, row_doc), rows, n_score)
    rank_sum = (nll[:, :rank_extra] if selector.lm_ranking == "prefix" else nll[:, rank_extra:]).sum(1)
    n_rows = [len(c) + off if c else 1 for c in cands]
    table = torch.full((len(cands), off + max(1, max(len(c) for c in cands))), float("inf"))  # (B, off + k_max)
    for b, c in enumerate(cands):
        if c:
            table[b, :n_rows[b]] = rank_sum[first_row[b]:first_row[b] + n_rows[b]]
    picks = selector.select(batch, table)
    was_reused = [any(got[r] is not None for r in range(first_row[b], first_row[b] + n_rows[b]))
                  for b in range(len(cands))]
    # the pick's row: a candidate's after the no-passage row (if any); -1 is the stride's no-passage row
    scored = [(nll[first_row[b] + (p + off if p >= 0 else 0), rank_extra:], was_reused[b]) for b, p in enumerate(picks)]
    res = _chunk_result(run, cands, picks, scored)
    targets = nll[:, rank_extra:]
    res.cand_stride = np.array([run[b].index for b in owner], dtype=np.int64)
    res.cand_docid = row_docid
    res.cand_n_tokens = np.full(len(owner), targets.shape[1], dtype=np.int64)
    res.cand_nll = targets.numpy().astype(np.float32).reshape(-1)
    return res


def _chunk_result(run: list[Window], cands: list[list["Passage"]], picks: Sequence[int],
                  scored: Sequence[tuple[torch.Tensor, bool]]) -> ChunkResult:
    """Per-stride sums (float64, summed in double) and the per-token NLLs, in the chunk's stride order;
    ``scored`` holds each stride's (target NLLs, reused from an earlier run)."""
    nlls = [n for n, _ in scored]
    return ChunkResult(
        stride_index=np.array([w.index for w in run], dtype=np.int64),
        stride_nll=np.array([float(n.double().sum()) for n in nlls], dtype=np.float64),
        stride_n_tokens=np.array([n.numel() for n in nlls], dtype=np.int64),
        chosen_rank=np.array(picks, dtype=np.int64), n_candidates=np.array([len(c) for c in cands], dtype=np.int64),
        token_nll=np.concatenate([n.numpy().astype(np.float32) for n in nlls]),
        reused=np.array([r for _, r in scored], dtype=bool),
        chosen=[cands[b][p] if p >= 0 else None for b, p in enumerate(picks)])


@dataclass
class LoopResult:
    """Everything the loop measured; perplexities are derived, never averaged."""
    n_tokens: int  # N: tokens in the text (the reference's token-level normaliser)
    stride_index: np.ndarray  # (S,) int
    stride_nll: np.ndarray  # (S,) float64 summed NLL of each stride's targets
    stride_n_tokens: np.ndarray  # (S,) int scored targets per stride
    chosen_rank: np.ndarray  # (S,) int BM25 rank of the chosen passage, -1 = none
    chosen: list  # (S,) the chosen Passage (docid, title, text) or None
    n_candidates: np.ndarray  # (S,) int
    token_nll: np.ndarray  # (n_scored,) float32
    token_ids: np.ndarray  # (n_scored,) int target token ids
    token_stride: np.ndarray  # (n_scored,) int stride of each token
    reused: np.ndarray  # (S,) bool, target NLLs taken from an earlier run (eval.reuse)
    extras: dict = field(default_factory=dict)
    cand_stride: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # as in ChunkResult
    cand_docid: list = field(default_factory=list)
    cand_n_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cand_nll: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def chosen_docid(self) -> list[str]:
        return [p.docid if p is not None else "" for p in self.chosen]

    @property
    def nll_sum(self) -> float:
        """Total NLL summed per stride; ``nll_sum_tokens`` is the same total summed per token."""
        return float(self.stride_nll.sum())

    @property
    def nll_sum_tokens(self) -> float:
        return float(self.token_nll.astype(np.float64).sum())

    def perplexity(self, count: int) -> float:
        return float(np.exp(self.nll_sum / count))


def assemble(ids: Sequence[int], windows: Sequence[Window], results: Sequence[ChunkResult]) -> LoopResult:
    """One :class:`LoopResult` from the chunks' results (any order)."""
    results = sorted(results, key=lambda r: int(r.stride_index[0]))
    si = np.concatenate([r.stride_index for r in results])
    if not np.array_equal(si, np.arange(len(windows))):
        raise ValueError(f"chunk results cover strides {si[:5]}..., expected 0..{len(windows) - 1} exactly once")
    ids_np = np.asarray(ids, dtype=np.int64)
    n = np.concatenate([r.stride_n_tokens for r in results])
    token_ids = np.concatenate([ids_np[w.end - c:w.end] for w, c in zip(windows, n)])
    return LoopResult(
        n_tokens=len(ids_np), stride_index=si, stride_nll=np.concatenate([r.stride_nll for r in results]),
        stride_n_tokens=n, chosen_rank=np.concatenate([r.chosen_rank for r in results]),
        chosen=[p for r in results for p in r.chosen], n_candidates=np.concatenate([r.n_candidates for r in results]),
        token_nll=np.concatenate([r.token_nll for r in results]), token_ids=token_ids,
        token_stride=np.repeat(si, n), reused=np.concatenate([r.reused for r in results]),
        cand_stride=np.concatenate([r.cand_stride for r in results]), cand_docid=[d for r in results for d in r.cand_docid],
        cand_n_tokens=np.concatenate([r.cand_n_tokens for r in results]),
        cand_nll=np.concatenate([r.cand_nll for r in results]))


def prefix_texts(tokenizer, wins: torch.Tensor, trg: int, selector: Selector) -> list[str]:
    """What the selector may read: each window's tokens before its targets, decoded (or "" if unread)."""
    if not selector.reads_prefix:
        return [""] * wins.size(0)
    return tokenizer.batch_decode(wins[:, : wins.size(1) - trg].tolist())
