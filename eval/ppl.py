"""``python -m eval.ppl``: retrieval-augmented perplexity with any reranker (DESIGN §2).

Examples::

    python -m eval.ppl --model gpt2 --index wikipedia-dpr-100w --reranker bm25
    python -m eval.ppl --model gpt2 --retrieval-file retrieval.json --reranker zero-shot
    python -m eval.ppl --config configs/ppl.yaml --reranker checkpoints/reranker/export

Settings come from ``--config`` YAML (keys = the flag names, dashes or underscores), then flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from eval.config import PplConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.ppl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML file of settings (flag names as keys); flags override it")
    docs = PplConfig.field_docs()
    defaults = PplConfig.__dataclass_fields__
    for name in PplConfig.names():
        default = defaults[name].default
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f"{docs.get(name, '')} (default: {default})")
        else:
            typ = type(default) if default is not None else str
            p.add_argument(flag, type=typ, default=None, help=f"{docs.get(name, '')} (default: {default})")
    return p


def parse_config(argv: list[str] | None = None) -> PplConfig:
    args = build_parser().parse_args(argv)
    values: dict = {}
    if args.config:
        import yaml

        raw = yaml.safe_load(Path(args.config).read_text()) or {}
        unknown = [k for k in raw if k.replace("-", "_") not in PplConfig.names()]
        if unknown:
            raise ValueError(f"{args.config}: unknown setting(s) {unknown}; valid: {PplConfig.names()}")
        values.update({k.replace("-", "_"): v for k, v in raw.items()})
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    return PplConfig(**values)


def make_selector(cfg: PplConfig, device):
    from ralm.selectors import BUILTIN, RandomCandidate, ZeroShotOtherLM

    name = cfg.reranker
    if name == "random":
        return RandomCandidate(cfg.seed)
    if name == "zero-shot" and cfg.zero_shot_model and cfg.zero_shot_model != cfg.model:
        from ralm.scoring import context_length, load_causal_lm

        zs_model, zs_tok = load_causal_lm(cfg.zero_shot_model, str(device))
        return ZeroShotOtherLM(zs_model, zs_tok, rank_tokens=cfg.zero_shot_tokens, doc_max_tokens=cfg.doc_max_tokens,
                               max_length=min(cfg.max_length, context_length(zs_model)),
                               batch_size=cfg.batch_size, dtype=cfg.dtype)
    if name in BUILTIN:
        return BUILTIN[name]()
    if Path(name).exists():
        from reranking.selector import PredictiveSelector

        return PredictiveSelector.from_path(name, device=str(device), batch_size=cfg.reranker_batch_size)
    raise ValueError(f"--reranker {name!r}: not one of {sorted(BUILTIN)} and no such file or directory "
                     "(a trained reranker is an export directory or a Lightning .ckpt)")


def markdown_table(results: dict) -> str:
    rows = [("reranker", results["reranker"]), ("word-level ppl", f"{results['ppl_word']:.4f}"),
            ("token-level ppl", f"{results['ppl_token']:.4f}"), ("scored tokens", results["n_scored_tokens"]),
            ("words (spaces)", results["n_words"]), ("text tokens N", results["n_tokens"]),
            ("strides with a document", results["strides_with_document"]),
            ("strides without a document", results["strides_without_document"])]
    out = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    if results["chosen_rank_counts"]:
        out += ["", "| BM25 rank chosen | strides |", "|---|---|"]
        out += [f"| {r} | {n} |" for r, n in results["chosen_rank_counts"].items()]
    return "\n".join(out) + "\n"


def write_outputs(out_dir: Path, cfg: PplConfig, res, n_words: int, meta: dict) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    ppl_strides = float(np.exp(res.nll_sum / n_words))
    ppl_tokens = float(np.exp(res.nll_sum_tokens / n_words))
    if not np.isclose(ppl_strides, ppl_tokens, rtol=1e-5):  # the reference's second computation
        raise AssertionError(f"perplexity summed per stride ({ppl_strides}) != per token ({ppl_tokens})")
    with_doc = res.chosen_rank >= 0
    ranks, counts = np.unique(res.chosen_rank[with_doc], return_counts=True)
    results = {
        "reranker": cfg.reranker, "model": cfg.model,
        "ppl_word": ppl_strides, "ppl_token": res.perplexity(res.n_tokens),
        "ppl_word_from_tokens": ppl_tokens, "nll_sum": res.nll_sum,
        "n_scored_tokens": int(res.token_nll.size), "n_words": n_words, "n_tokens": res.n_tokens,
        "n_strides": int(res.stride_index.size),
        "strides_with_document": int(with_doc.sum()), "strides_without_document": int((~with_doc).sum()),
        "chosen_rank_counts": {int(r): int(c) for r, c in zip(ranks, counts)},
        "word_count_convention": "number of ' ' characters in the text (reference eval_lm.py)",
        "config": cfg.to_dict(), **meta,
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown_table(results))
    pq.write_table(pa.table({
        "stride": res.stride_index, "nll": res.stride_nll, "n_tokens": res.stride_n_tokens,
        "chosen_rank": res.chosen_rank, "chosen_docid": res.chosen_docid, "n_candidates": res.n_candidates,
    }), out_dir / "strides.parquet")
    np.savez_compressed(out_dir / "tokens.npz", nll=res.token_nll, token_id=res.token_ids, stride=res.token_stride)
    return results


def run(cfg: PplConfig, progress: bool = True) -> dict:
    """Evaluate one reranker; returns the results dict also written to ``cfg.output_dir``."""
    from eval.candidates import make_candidate_fn
    from eval.loop import run_loop
    from ralm.scoring import LMScorer, context_length, load_causal_lm, resolve_device
    from ralm.text import load_text, word_count

    t0 = time.time()
    device = resolve_device(cfg.device)
    text = load_text(cfg.dataset, cfg.dataset_config, cfg.split, cfg.text_file)
    model, tokenizer = load_causal_lm(cfg.model, str(device))
    max_length = min(cfg.max_length, context_length(model))  # as the reference does
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    selector = make_selector(cfg, device)
    candidates, retrieval_meta = (make_candidate_fn(cfg, text, ids, tokenizer, max_length)
                                  if selector.uses_documents else (None, {}))
    res = run_loop(ids, tokenizer, LMScorer(model, cfg.batch_size, cfg.dtype), selector, candidates,
                   stride=cfg.stride, max_length=max_length, doc_max_tokens=cfg.doc_max_tokens,
                   zero_shot_tokens=cfg.zero_shot_tokens, k=cfg.k, strides_per_chunk=cfg.strides_per_chunk,
                   progress=progress)
    meta = {"max_length_used": max_length, "seconds": round(time.time() - t0, 2), "retrieval": retrieval_meta}
    return write_outputs(Path(cfg.output_dir), cfg, res, word_count(text), meta)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(argv)
        results = run(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"eval.ppl: error: {e}", file=sys.stderr)
        return 2
    print(markdown_table(results))
    print(f"results: {Path(cfg.output_dir) / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
