"""Whether a perplexity change means anything: a paired bootstrap interval and a sign test.

Both compare a run with a baseline run *of the same text and windows*, stride by stride (the same
strides are scored in both), so every comparison is paired.

* :func:`paired_bootstrap` (Koehn 2004; sacreBLEU's ``--paired-bs``): resample whole *units* (articles,
  or blocks of consecutive strides where there are few articles; never single strides, which are
  correlated) with replacement, the same draw for both runs, and recompute the relative change of word
  perplexity ``exp((NLL_run - NLL_base) / words) - 1`` on each resample. A unit's words are its share of
  the text's words in proportion to its scored tokens (the point estimate uses the exact total). The
  result is the 95 % percentile interval and the share of resamples in which the run is not better.
  Runs of several training seeds of one reranker are compared through their mean NLL per stride, and each
  resample also draws the seeds with replacement, so that the interval holds over seeds as well as text.
* :func:`sign_test`: strides whose NLL went down against up (ties dropped), two-sided exact binomial
  p-value under "either direction is as likely".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345
#: Blocks of consecutive strides when the runs hold no article per stride (older runs).
DEFAULT_BLOCKS = 20


@dataclass(frozen=True)
class Bootstrap:
    change: float       # relative change of word perplexity (run / base - 1), the point estimate
    low: float          # 95 % interval
    high: float
    p_not_better: float  # share of resamples with change >= 0
    units: int
    unit: str           # "article" or "block"

    def cell(self) -> str:
        return f"{100 * self.change:+.1f}% [{100 * self.low:+.1f}, {100 * self.high:+.1f}]"


def units_of(n_strides: int, article: np.ndarray | None, blocks: int = DEFAULT_BLOCKS) -> tuple[np.ndarray, str]:
    """Unit index per stride: the article it scores when known (and there are at least 2), else one of
    ``blocks`` runs of consecutive strides."""
    if article is not None and len(np.unique(article)) >= 2:
        _, unit = np.unique(article, return_inverse=True)
        return unit.astype(np.int64), "article"
    blocks = max(1, min(blocks, n_strides))
    return (np.arange(n_strides) * blocks // max(n_strides, 1)).astype(np.int64), "block"


def paired_bootstrap(nll: np.ndarray, base_nll: np.ndarray, n_tokens: np.ndarray, n_words: int, unit: np.ndarray,
                     unit_name: str, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Paired bootstrap of the word-perplexity change of ``nll`` against ``base_nll`` (per-stride NLL sums
    in nats, the same strides in the same order), resampling the units ``unit`` (index per stride).

    ``nll`` may be ``[S, N]``, one row per training seed: the change is that of the seeds' mean NLL, and
    every resample draws S seeds with replacement besides the units (with one row it is the plain case).
    """
    runs = np.atleast_2d(nll)                                            # (S, N)
    if runs.shape[1:] != base_nll.shape or base_nll.shape != n_tokens.shape or n_tokens.shape != unit.shape:
        raise ValueError(f"per-stride arrays differ in shape: {nll.shape}, {base_nll.shape}, {n_tokens.shape}, "
                         f"{unit.shape}")
    n_units, n_seeds = int(unit.max()) + 1, runs.shape[0]
    delta = np.stack([np.bincount(unit, weights=r - base_nll, minlength=n_units) for r in runs])  # (S, U) nats
    toks = np.bincount(unit, weights=n_tokens, minlength=n_units)        # (U,) scored tokens
    words_per_token = n_words / n_tokens.sum()
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, n_units, size=(samples, n_units))            # (B, U) unit indices
    if n_seeds == 1:
        delta_b = delta[0][draw].sum(1)                                  # (B,) the draws of a single run
    else:
        seeds = rng.integers(0, n_seeds, size=(samples, n_seeds))       # (B, S) seed indices
        delta_b = np.stack([delta[seeds[b]].mean(0)[draw[b]].sum() for b in range(samples)])
    change_b = np.expm1(delta_b / (words_per_token * toks[draw].sum(1)))  # (B,)
    change = math.expm1(float((runs - base_nll).sum()) / n_seeds / n_words)
    low, high = np.percentile(change_b, [2.5, 97.5])
    return Bootstrap(change, float(low), float(high), float((change_b >= 0).mean()), n_units, unit_name)


def sign_test(nll: np.ndarray, base_nll: np.ndarray, tol: float = 1e-6,
              ties: np.ndarray | None = None) -> tuple[int, int, float]:
    """(strides better, strides worse, two-sided exact binomial p-value); |difference| <= tol is a tie, and
    so is every stride where ``ties`` is True (the LM read the same input in both runs: what differs there is
    the rounding of differently shaped batches, which no tolerance separates from real changes)."""
    d = nll - base_nll
    if ties is not None:
        d = np.where(ties, 0.0, d)
    better, worse = int((d < -tol).sum()), int((d > tol).sum())
    n = better + worse
    if n == 0:
        return 0, 0, 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1))
    return better, worse, min(1.0, 2 * tail / 2 ** n)


def p_cell(p: float) -> str:
    return "<1e-4" if p < 1e-4 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
