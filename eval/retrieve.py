"""``python -m eval.retrieve``: BM25 retrieval for every stride, saved in the reference JSON format.

The counterpart of the reference's ``prepare_retrieval_data.py --retrieval_type sparse``: the same
windows, the same queries (decoded last ℓ tokens before each stride's targets), the k allowed
passages. ``eval.ppl --retrieval-file`` reads the result, and so does the reference ``eval_lm.py``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.retrieve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default="gpt2", help="LM tokenizer: hub name or local directory (default: gpt2)")
    p.add_argument("--text-file", help="local evaluation text (default: the Hugging Face dataset below)")
    p.add_argument("--dataset", default="wikitext")
    p.add_argument("--dataset-config", default="wikitext-103-v1")
    p.add_argument("--split", default="test")
    p.add_argument("--index", required=True, help="Pyserini prebuilt index name or local Lucene index directory")
    p.add_argument("--output", required=True, help="reference-format JSON file to write")
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--query-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--k1", type=float, default=0.9)
    p.add_argument("--b", type=float, default=0.4)
    p.add_argument("--no-forbidden-titles", action="store_true",
                   help="do not skip passages titled like the evaluation text's articles")
    args = p.parse_args(argv)
    try:
        from transformers import AutoTokenizer

        from eval.candidates import reference_entries_for, retrieve_all
        from ralm.corpus import forbidden_titles
        from ralm.retrieval import BM25Retriever, write_reference_json
        from ralm.text import load_text
        from ralm.windows import stride_windows

        text = load_text(args.dataset, args.dataset_config, args.split, args.text_file)
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        windows = stride_windows(len(ids), args.stride, args.max_length)
        retriever = BM25Retriever(args.index, k1=args.k1, b=args.b)
        forbidden = set() if args.no_forbidden_titles else forbidden_titles(text)
        queries, passages = retrieve_all(windows, ids, tok, retriever, k=args.k, query_tokens=args.query_tokens,
                                         forbidden=forbidden)
        write_reference_json(args.output, reference_entries_for(windows, ids, tok, queries, passages))
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"eval.retrieve: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(windows)} strides, {len(forbidden)} forbidden titles, k={args.k} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
