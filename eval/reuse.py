"""LM scores an earlier evaluation already computed (``eval.ppl --reuse_from DIR``).

A stride's LM input is its window with the chosen passage written over the window's start, so two runs
on the same text, LM, windows, precision and candidates that choose the same passage for a stride feed
the LM the same tokens. Rerankers with a BM25 prior agree with BM25 on most strides (65-73 % for the
real-text bi_bm25 rerankers), so a reranker's evaluation can take those strides' target NLLs from the BM25 run and forward only the
strides where it chose differently. A zero-shot or oracle run scored every candidate to choose and keeps
each candidate's target NLLs (``candidates.npz``): reusing it, a bm25, cosine or predictive run forwards no
stride that has a candidate, and an oracle run forwards nothing at all (it ranks on those same target NLLs; a
zero-shot run cannot reuse, as it ranks on the s' tokens before the targets, which no run keeps); a none run
lends its windows without a passage, which the abstaining rerankers also score (oracle-abstain reusing an oracle
and a none run forwards nothing). The numbers
are the earlier run's own; each stride records whether it was reused (``strides.parquet``'s ``reused``,
``results.json``'s ``strides_reused``), and a run that reused has no cost figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.parquet as pq
import torch

from eval.results import CANDIDATES, read_complete
from ralm.settings import InputError

#: What must be equal for a stride's LM input and its scoring to be the same (the reranker may differ).
MATCH = ("model", "windows", "dtype", "retrieval")


class ReusedScores:
    """Target NLLs by (stride, chosen docid) from finished runs; ``""`` is "no passage"."""
    def __init__(self, scores: dict[tuple[int, str], np.ndarray]):
        self.scores = scores

    @classmethod
    def load(cls, dirs: Sequence[str], identity: dict) -> "ReusedScores":
        """The finished ``eval.ppl`` runs in ``dirs``, each checked against this run's ``identity``."""

        scores: dict[tuple[int, str], np.ndarray] = {}
        for d in map(Path, dirs):
            done = read_complete(d)
            if done is None:
                raise InputError(f"--reuse_from {d}: not a finished eval.ppl run (no results.json, or its files "
                                 "do not match their hashes); finish it first or leave it out")
            _check_same_inputs(d, done["identity"], identity)
            if CANDIDATES in done.get("files", {}):  # every candidate's target NLLs (zero-shot, oracle), the
                with np.load(d / CANDIDATES, allow_pickle=False) as z:  # chosen ones among them
                    stride, n_tokens, nll = z["stride"], z["n_tokens"], z["nll"]
                    docids = json.loads(z["docid"].tobytes().decode())
                for s, docid, end, n in zip(stride, docids, np.cumsum(n_tokens), n_tokens):
                    scores.setdefault((int(s), docid), nll[end - n:end])
                continue
            strides = pq.read_table(d / "strides.parquet", columns=["stride", "chosen_docid"]).to_pydict()
            with np.load(d / "tokens.npz", allow_pickle=False) as z:
                nll, owner = z["nll"], z["stride"]
            bounds = np.searchsorted(owner, np.arange(len(strides["stride"]) + 1))
            for s, docid in zip(strides["stride"], strides["chosen_docid"]):
                scores.setdefault((int(s), docid), nll[bounds[s]:bounds[s + 1]])
        return cls(scores)

    def get(self, stride: int, docid: str, n_targets: int) -> torch.Tensor | None:
        got = self.scores.get((stride, docid))
        if got is None:
            return None
        if len(got) != n_targets:
            raise InputError(f"--reuse_from: stride {stride} scored {len(got)} targets there and {n_targets} here; "
                             "the runs do not cut the same windows")
        return torch.from_numpy(got.copy())


def _check_same_inputs(d: Path, theirs: dict, ours: dict) -> None:
    # a run that retrieved nothing (none) lends windows without a passage, whatever the candidates
    differ = [k for k in MATCH if theirs.get(k) != ours.get(k) and not (k == "retrieval" and theirs.get(k) is None)]
    if theirs["text"]["sha256"] != ours["text"]["sha256"]:
        differ.insert(0, "text")
    if differ:
        raise InputError(f"--reuse_from {d}: that run differs from this one in {', '.join(differ)} (see its "
                         "results.json 'identity'); only a run on the same text, LM, windows, precision and "
                         "candidates gives the same LM inputs")
