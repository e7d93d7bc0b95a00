"""Predictive reranker: a bi-encoder or a cross-encoder trained on LM log-probabilities (Ram et al., 2023, §6).

Library use::

    import reranking
    r = reranking.load("checkpoints/reranker/version_0/reranker")   # an export or a fit .ckpt
    scores, order = r.rank(prefix_text, ["Title\\npassage text", ...])
"""


def load(path, device="cpu", batch_size: int = 64):
    """A trained reranker (:class:`reranking.encoder_selectors.PredictiveSelector`) from an export directory or a
    ``reranking.fit`` checkpoint; ``.rank(prefix, passages)`` gives scores and order."""
    from reranking.encoder_selectors import PredictiveSelector

    return PredictiveSelector.from_path(path, device=device, batch_size=batch_size)
