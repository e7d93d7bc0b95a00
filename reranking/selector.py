"""The trained reranker as a selector of the evaluation loop (``ralm.selectors.Selector``)."""

from __future__ import annotations

from pathlib import Path

import torch

from ralm.selectors import Selector, StrideBatch
from reranking.inputs import InputFormat, encode_pairs


class PredictiveSelector(Selector):
    """Picks ``argmax_j f(prefix, candidate_j)`` per stride with a trained cross-encoder (``-1`` if none).

    Pairs are built exactly as in training (:func:`reranking.inputs.encode_pairs` with the export's
    :class:`~reranking.inputs.InputFormat`) and scored in micro-batches of ``batch_size`` pairs.
    """

    name = "predictive"
    lm_ranking = None  # needs no generator scores

    def __init__(self, model, tokenizer, fmt: InputFormat, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"PredictiveSelector: batch_size={batch_size} must be >= 1")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.batch_size = batch_size

    @classmethod
    def from_path(cls, path: str | Path, device: str | torch.device = "cpu", batch_size: int = 64) -> "PredictiveSelector":
        """Load from an export directory or a Lightning ``.ckpt`` of :class:`reranking.system.RerankerSystem`."""
        from reranking.export import load_reranker

        model, tokenizer, fmt = load_reranker(path, device=device)
        return cls(model, tokenizer, fmt, batch_size=batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def scores(self, batch: StrideBatch) -> list[torch.Tensor]:
        """f(x_i, d_ij) for every stride i: a float32 CPU tensor of length ``len(batch.candidates[i])``."""
        pairs = [(i, p.document()) for i, cands in enumerate(batch.candidates) for p in cands]
        flat = torch.empty(len(pairs), dtype=torch.float32)
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start: start + self.batch_size]
            used = sorted({i for i, _ in chunk})
            where = {i: j for j, i in enumerate(used)}
            enc = encode_pairs(self.tokenizer, [batch.prefix_texts[i] for i in used], [d for _, d in chunk],
                               self.fmt, pair_prefix=[where[i] for i, _ in chunk])
            enc = {k: v.to(self.device) for k, v in enc.items()}
            flat[start: start + len(chunk)] = self.model(**enc).float().cpu()
        return list(torch.split(flat, [len(c) for c in batch.candidates]))

    def select(self, batch: StrideBatch, lm_nll: torch.Tensor | None = None) -> list[int]:
        return [int(s.argmax()) if len(s) else -1 for s in self.scores(batch)]
