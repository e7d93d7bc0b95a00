"""The shared core: token windows, BM25 retrieval, the frozen-LM scorer and candidate selectors.

Stages (``data_gen``, ``reranking``, ``eval``) import this package; it imports none of them.
"""
