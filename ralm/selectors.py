"""Candidate selectors: which of the k retrieved passages (if any) the LM is conditioned on.

A selector sees a batch of strides (the prefix text each stride's LM window holds before its
targets, and the allowed BM25 candidates in rank order) and returns one index per stride, ``-1``
meaning "no document". Two selectors need the generator's own scores of every candidate; they say
so with ``lm_ranking`` and the evaluation loop hands them those scores, computed in the same
forward pass that scores the targets (so oracle and zero-shot cost one pass, not two).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from ralm.scoring import DocumentEncoder, LMScorer
from ralm.settings import Scoring, Windows

if TYPE_CHECKING:
    from ralm.retrieval import Passage


@dataclass
class StrideBatch:
    """What a selector may look at: only the past and the candidates, never the targets."""

    prefix_texts: list[str]  # decode of the window tokens before the targets (== data_gen's prefix_text)
    candidates: list[list["Passage"]]  # allowed BM25 candidates per stride, rank order; may be empty
    stride_ids: list[int]  # global stride numbers (seed per-stride randomness with these)

    def __post_init__(self):
        if not len(self.prefix_texts) == len(self.candidates) == len(self.stride_ids):
            raise ValueError(f"StrideBatch lengths differ: {len(self.prefix_texts)} prefixes, "
                             f"{len(self.candidates)} candidate lists, {len(self.stride_ids)} stride ids")


class Selector(abc.ABC):
    """Picks one candidate per stride (``-1`` = none)."""

    name: str = "selector"
    uses_documents: bool = True  # False → the loop skips retrieval altogether
    reads_prefix: bool = True  # False → the loop need not decode prefix texts (they stay "")
    # "prefix": the loop passes the generator's summed NLL of the s' tokens before the targets per
    # candidate; "targets": of the targets themselves (oracle); None: nothing.
    lm_ranking: Literal["prefix", "targets"] | None = None
    # True: may choose no passage where there are candidates; an LM ranker's lm_nll then begins with a column
    # for the window without a passage (its own first tokens kept), before the candidates'.
    abstains: bool = False

    @property
    def needs_lm_scores(self) -> bool:
        return self.lm_ranking is not None

    def to(self, device) -> "Selector":
        """Move the selector's own model (if any) to ``device``; the evaluation calls this once."""
        return self

    @abc.abstractmethod
    def select(self, batch: StrideBatch, lm_nll: torch.Tensor | None = None) -> list[int]:
        """One index into ``batch.candidates[i]`` per stride, or -1.

        lm_nll: (B, k_max) float32 summed NLL of the ranking tokens per candidate (``inf`` where a
        stride has fewer candidates); given only when ``lm_ranking`` is set; (B, 1 + k_max) when the
        selector ``abstains``, column 0 the window without a passage.
        """


class NoRetrieval(Selector):
    name = "none"
    reads_prefix = False
    uses_documents = False

    def select(self, batch, lm_nll=None):
        return [-1] * len(batch.stride_ids)


class BM25First(Selector):
    """BM25's top hit (the reference's ``first``)."""

    name = "bm25"
    reads_prefix = False

    def select(self, batch, lm_nll=None):
        return [0 if c else -1 for c in batch.candidates]


class RandomCandidate(Selector):
    """A uniformly random candidate, seeded per stride so the choice is independent of batching."""

    name = "random"
    reads_prefix = False

    def __init__(self, seed: int = 0):
        self.seed = seed

    def select(self, batch, lm_nll=None):
        return [int(np.random.default_rng([self.seed, s]).integers(len(c))) if c else -1
                for s, c in zip(batch.stride_ids, batch.candidates)]


class _ArgminLM(Selector):
    """The first minimum of the LM's sums; for one that ``abstains``, column 0 is no passage (a tie keeps the
    window's own tokens) and a pick of it is -1."""

    reads_prefix = False

    def select(self, batch, lm_nll=None):
        if lm_nll is None:
            raise ValueError(f"the {self.name} selector needs the generator's candidate scores (lm_nll)")
        # torch.argmin returns the first minimum, like the reference; inf marks missing candidates.
        off = int(self.abstains)
        return [p - off if c else -1 for p, c in zip(torch.argmin(lm_nll, dim=1).tolist(), batch.candidates)]


class ZeroShotLM(_ArgminLM):
    """The generator itself ranks: smallest NLL of the last s' prefix tokens given the candidate."""

    name = "zero-shot"
    lm_ranking = "prefix"


class Oracle(_ArgminLM):
    """Smallest NLL of the targets themselves: an upper bound that uses the future (analysis only)."""

    name = "oracle"
    lm_ranking = "targets"


class ZeroShotOtherLM(Selector):
    """Zero-shot ranking by a separate (usually smaller) LM whose vocabulary may differ.

    The prefix text is re-tokenized with the ranking LM's tokenizer and cut from the left to its
    context; each candidate (tokenized by that tokenizer, ``doc_max_tokens`` budget) overwrites the
    start, and the candidate with the smallest NLL of the last ``rank_tokens`` tokens wins.
    """

    name = "zero-shot"

    def __init__(self, model, tokenizer, rank_tokens: int = Windows.zero_shot_tokens,
                 doc_max_tokens: int = Windows.doc_max_tokens, max_length: int = Windows.max_length,
                 batch_size: int = Scoring.batch_size, dtype: str = Scoring.dtype):
        self.scorer = LMScorer(model, batch_size=batch_size, dtype=dtype)
        self.tokenizer = tokenizer
        self.docs = DocumentEncoder(tokenizer, doc_max_tokens)
        self.rank_tokens = rank_tokens
        self.max_length = max_length

    def to(self, device):
        self.scorer.model.to(device)
        self.scorer.device = next(self.scorer.model.parameters()).device
        return self

    def select(self, batch, lm_nll=None):
        picks = [-1] * len(batch.stride_ids)
        enc = self.tokenizer(batch.prefix_texts, add_special_tokens=False)["input_ids"]
        by_len: dict[int, list[int]] = {}
        for i, ids in enumerate(enc):
            if batch.candidates[i]:
                by_len.setdefault(min(len(ids), self.max_length), []).append(i)
        for width, idx in by_len.items():
            if width <= self.rank_tokens:  # nothing to condition on: keep BM25's order
                for i in idx:
                    picks[i] = 0
                continue
            rows, docs, owner = [], [], []
            for i in idx:
                window = torch.tensor(enc[i][-width:])
                for d in self.docs([p.document() for p in batch.candidates[i]]):
                    rows.append(window)
                    docs.append(d)
                    owner.append(i)
            windows = torch.stack(rows)
            nll = self.scorer.nll(self.docs.condition(windows, docs), windows, self.rank_tokens).sum(1)
            start = 0
            for i in idx:
                k = len(batch.candidates[i])
                picks[i] = int(torch.argmin(nll[start:start + k]))
                start += k
        return picks


class ZeroShotOrNone(_ArgminLM):
    """Zero-shot that may take no passage: none when no candidate lowers the NLL of the s' prefix tokens."""

    name = "zero-shot-abstain"
    lm_ranking = "prefix"
    abstains = True


class OracleOrNone(_ArgminLM):
    """The oracle that may take no passage: never worse than ``none`` on a stride (an upper bound, analysis only)."""

    name = "oracle-abstain"
    lm_ranking = "targets"
    abstains = True


BUILTIN = {"none": NoRetrieval, "bm25": BM25First, "first": BM25First, "random": RandomCandidate,
           "zero-shot": ZeroShotLM, "oracle": Oracle, "zero-shot-abstain": ZeroShotOrNone,
           "oracle-abstain": OracleOrNone}
