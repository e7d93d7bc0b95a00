"""Reranker losses over k candidates per example, computed in log space.

All take the same documented inputs:

- ``scores``: ``FloatTensor[B, k]``, the reranker's f(x, d_j) (any real values; masked entries ignored);
- ``lm_logprobs``: ``FloatTensor[B, k]``, log p_LM(y | d_j ; x) summed over the target tokens
  (typically -5 to -60 for 4 tokens; masked entries ignored, may hold anything finite);
- ``mask``: ``BoolTensor[B, k]``, True for real candidates. Examples with fewer than k candidates are
  padded; every row needs at least one True.

All return the mean over the B examples. LM log-probabilities are never exponentiated on their own:
for 4 tokens, exp(-40) is already near float32's smallest normal number.
"""

from __future__ import annotations

import torch
from torch import nn


def _check(scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None, who: str) -> torch.Tensor:
    if scores.dim() != 2:
        raise ValueError(f"{who}: scores must be [B, k], got shape {tuple(scores.shape)}")
    if lm_logprobs.shape != scores.shape:
        raise ValueError(f"{who}: scores {tuple(scores.shape)} and lm_logprobs {tuple(lm_logprobs.shape)} "
                         "must have the same [B, k] shape")
    if mask is None:
        return torch.ones_like(scores, dtype=torch.bool)
    if mask.shape != scores.shape:
        raise ValueError(f"{who}: mask {tuple(mask.shape)} must match scores {tuple(scores.shape)}")
    mask = mask.bool()
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if len(empty):
        raise ValueError(f"{who}: examples {empty.tolist()[:10]} have no unmasked candidate; "
                         "drop them in the data pipeline")
    return mask


def masked_log_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log_softmax over the unmasked candidates of each row; masked entries are -inf. ``[B, k]`` float32."""
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=scores.device)
    return torch.log_softmax(torch.where(mask, scores.float(), neg_inf), dim=-1)


class MarginalLikelihoodLoss(nn.Module):
    """``-log sum_j softmax(f)_j * p_LM(y | d_j ; x)``, as ``-logsumexp_j(log_softmax(f)_j + lm_logprobs_j)``.

    The reranker's distribution over candidates is treated as a latent choice of document, and the
    loss is the negative log marginal likelihood of the targets y (Ram et al., 2023, §6.1).

    Inputs: ``scores[B, k]``, ``lm_logprobs[B, k]``, ``mask[B, k]`` (optional), see the module docstring.
    Output: scalar, mean over examples.

    Example::

        >>> loss = MarginalLikelihoodLoss()
        >>> f = torch.tensor([[2.0, 0.0, -1.0]])
        >>> lp = torch.tensor([[-20.0, -12.0, -30.0]])
        >>> loss(f, lp, torch.tensor([[True, True, False]]))  # candidate 3 is padding
        tensor(14.1245)
    """

    def per_example(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Loss of each example, ``FloatTensor[B]``."""
        mask = _check(scores, lm_logprobs, mask, "MarginalLikelihoodLoss")
        log_q = masked_log_softmax(scores, mask)                                     # [B, k], -inf where masked
        lp = torch.where(mask, lm_logprobs.float(), torch.zeros((), device=scores.device))  # padding may be anything
        return -torch.logsumexp(log_q + lp, dim=-1)                                    # [B]

    def forward(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.per_example(scores, lm_logprobs, mask).mean()


class DistillationLoss(nn.Module):
    """KL(p_LM || q_f) with ``p_LM = softmax(lm_logprobs / temperature)`` and ``q_f = softmax(f)`` (batchmean).

    The LM's preference over candidates as a soft target (cf. Atlas's "perplexity distillation"); the
    masked candidates get probability 0 on both sides. Mean over examples (``batchmean``, the true KL,
    not the ``mean`` reduction PyTorch warns about).

    Inputs: ``scores[B, k]``, ``lm_logprobs[B, k]``, ``mask[B, k]`` (optional). Output: scalar.
    """

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"DistillationLoss: temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.per_example(scores, lm_logprobs, mask).mean()  # = sum / B: "batchmean"

    def per_example(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """KL of each example, ``FloatTensor[B]``."""
        mask = _check(scores, lm_logprobs, mask, "DistillationLoss")
        log_q = masked_log_softmax(scores, mask)                               # [B, k]
        log_p = masked_log_softmax(lm_logprobs.float() / self.temperature, mask)  # [B, k], target
        zero = torch.zeros((), device=scores.device)
        kl = torch.where(mask, log_p.exp() * (log_p - log_q), zero)           # 0 on padding (avoids -inf - -inf)
        return kl.sum(dim=-1)                                                 # [B]


class ExpectedNLLLoss(nn.Module):
    """``sum_j softmax(f)_j * (-lm_logprobs_j)``: the targets' NLL under a passage drawn from the reranker.

    The quantity evaluation measures, in expectation: as ``softmax(f)`` sharpens it becomes the NLL of
    the passage the reranker picks (``val/nll_reranker``). Its gradient on f_j is
    ``q_j * (E_q[lp] - lp_j)``: linear in nats. The marginal likelihood and distillation at τ 1 weigh
    candidates by ``exp(lp_j)`` instead, so one candidate that happened to suit the targets (hindsight:
    the oracle's ~6 nats on real text, against ~1 a prefix can predict) takes nearly all the weight, and a
    passage whose effect varies more is preferred at equal mean. This loss is risk-neutral in the LM's
    log-likelihood: it rewards a passage for its average effect.

    Inputs: ``scores[B, k]``, ``lm_logprobs[B, k]``, ``mask[B, k]`` (optional). Output: scalar, nats.
    """

    def forward(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.per_example(scores, lm_logprobs, mask).mean()

    def per_example(self, scores: torch.Tensor, lm_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Expected NLL of each example, ``FloatTensor[B]``."""
        mask = _check(scores, lm_logprobs, mask, "ExpectedNLLLoss")
        q = masked_log_softmax(scores, mask).exp()                                   # [B, k], 0 where masked
        nll = torch.where(mask, -lm_logprobs.float(), torch.zeros((), device=scores.device))
        return (q * nll).sum(dim=-1)                                                 # [B]
