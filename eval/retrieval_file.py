"""``python -m eval.retrieval_file``: BM25 retrieval for every stride, saved in the reference JSON format.

The counterpart of the reference's ``prepare_retrieval_data.py --retrieval_type sparse``: the same
windows, the same queries (decoded last l tokens before each stride's targets), the k allowed
passages. ``eval.ppl --retrieval_file`` reads the result, and so does the reference ``eval_lm.py``.

    python -m eval.retrieval_file --model gpt2 --retrieval.index wikipedia-dpr-100w --output retrieval.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from ralm.settings import WIKITEXT103_TEST, InputError, Retrieval, Text, Windows


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
    import tempfile

    from eval.candidates import IndexCandidates, reference_entries_for
    from eval.loop import make_chunks
    from ralm.corpus import forbidden_titles
    from ralm.progress import Progress
    from ralm.retrieval import write_reference_json
    from ralm.stage import tokenize_text

    if not retrieval.index:
        raise InputError("--retrieval.index is required")
    tokens = tokenize_text(model, text, windows, documents=False)  # retrieval places no document
    retrieval.check_windows(windows, tokens.max_length)
    body, tok, ids, wins = tokens.body, tokens.tokenizer, tokens.ids, tokens.wins
    forbidden = forbidden_titles(body) if retrieval.forbid_eval_titles else set()
    with tempfile.TemporaryDirectory() as tmp:
        src = IndexCandidates(retrieval, ids, tok, forbidden, cache_dir or tmp, verbose=verbose)
        queries, passages = [""], [[]]
        try:
            chunks = make_chunks(wins, 256)[1:]
            with Progress(len(wins), "BM25", "queries") as bar:
                for i, c in enumerate(chunks):
                    for ahead in chunks[i:i + 3]:
                        src.prefetch(ahead)
                    queries += src.queries(c)
                    passages += src.get(c)
                    bar.update(len(c.windows))
        finally:
            src.close()
    write_reference_json(output, reference_entries_for(wins, ids, tok, queries, passages))
    return f"{len(wins)} strides, {len(forbidden)} forbidden titles, k={retrieval.k} -> {Path(output)}"


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(retrieve, argv, "python -m eval.retrieval_file", description=__doc__,
               after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
