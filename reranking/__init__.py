"""Predictive reranker: a cross-encoder trained on LM log-probabilities (Ram et al., 2023, §6)."""
