"""Training data for the predictive reranker: ``python -m data_gen.build`` (see data_gen/build.py)."""
