"""``ralm-rerank``: the console command of an installed copy, one word per ``python -m`` entry point.

``ralm-rerank pipeline --config configs/recipes/demo.yaml`` is ``python -m pipeline ...`` run from anywhere:
a ``--config`` that names a shipped file (``configs/...``) is found in the installed copy (:mod:`ralm.shipped`)
when the working directory has none. ``ralm-rerank`` alone lists the commands.
"""

from __future__ import annotations

import sys

from ralm.cli import run_module
from ralm.shipped import locate

#: Every entry point, with what it does (tests/test_cli.py checks the list against the modules).
COMMANDS = {
    "pipeline": "the whole chain for an LM and a corpus: index, split, data, fit, eval, report (--verify: against "
                "the recipe's expected results)",
    "pipeline.published": "write docs/RESULTS.md's and the README's tables from the recipes' expected results",
    "ralm.corpus": "a Lucene BM25 index of a corpus (text, JSONL, BEIR, parquet, a saved dataset, .txt files)",
    "ralm.models": "list and fetch the offline-installable models",
    "ralm.kjv": "the King James Bible from the package index as a corpus and texts (retrieval hurts there)",
    "data_gen.build": "LM-scored training data: BM25's top k for sampled prefixes, log p(y | d; x)",
    "data_gen.scores_file": "export or import a dataset's LM scores",
    "data_gen.labeled_lists": "the training set as a Hugging Face dataset of labeled lists",
    "reranking.fit": "fine-tune a reranker (Lightning), with TensorBoard logs and an export",
    "reranking.formats": "write an export as sentence-transformers / transformers directories",
    "reranking.heldout": "a fitted reranker's loss and metrics on held-out data",
    "eval.ppl": "retrieval-augmented perplexity with one reranker",
    "eval.compare": "tables, paired intervals and sign tests of several eval.ppl runs",
    "eval.retrieval_file": "BM25's candidates of every stride, saved in the reference's JSON format",
    "eval.generate": "retrieval-augmented generation",
    "eval.qa": "open-domain question answering with retrieval",
    "demo.world": "the demo's synthetic world",
    "demo.questions": "the demo world's questions",
    "demo.train_lm": "train the demo's small GPT-2",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: ralm-rerank COMMAND [ARGS] (each command's --help says more)", "", "commands:",
                      *(f"  {name:{width}s}  {about}" for name, about in COMMANDS.items())])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"ralm-rerank: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    for i, a in enumerate(rest):  # --config FILE and --config=FILE
        if a.startswith("--config="):
            rest[i] = "--config=" + locate(a.split("=", 1)[1])
        elif i and rest[i - 1] == "--config":
            rest[i] = locate(a)
    sys.argv = [name, *rest]
    return run_module(f"{name}.__main__" if "." not in name else name, rest)


if __name__ == "__main__":
    sys.exit(main())
