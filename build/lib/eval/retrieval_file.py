"""``python -m eval.retrieval_file``: BM25 retrieval for every stride, saved in the reference JSON format.

The counterpart of the reference's ``prepare_retrieval_data.py --retrieval_type sparse``: the same
windows, the same queries (decoded last l tokens before each stride's targets), the k allowed
passages. ``eval.ppl --retrieval_file`` reads the result, and so does the reference ``eval_lm.py``.

    python -m eval.retrieval_file --model gpt2 --retrieval.index wikipedia-dpr-100w --output retrieval.json
"""

from __future__ import annotations

import sys

from ralm.cli import run
from ralm.settings import WIKITEXT103_TEST, Retrieval, Text, Windows


def retrieve(output: str, model: str = "gpt2", text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
             windows: Windows = Windows(), cache_dir: str | None = None, verbose: bool = False) -> str:
    """Write the reference-format retrieval file of a text.

    Args:
        output: The JSON file to write.
        model: The LM whose tokenizer (and context length) defines the strides.
        text: The evaluation text.
        retrieval: BM25 settings (index, k, query tokens, k1, b, forbidden titles).
        windows: Stride and window (the document budget is unused here).
        cache_dir: Retrieval cache directory (default: none).
        verbose: Show Java logging.
    """
    from eval.candidates import write_retrieval_file  # the tokenizer, the search process

    return write_retrieval_file(output, model, text, retrieval, windows, cache_dir, verbose)


def main(argv: list[str] | None = None) -> int:
    return run(retrieve, argv, "python -m eval.retrieval_file", description=__doc__,
               after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
