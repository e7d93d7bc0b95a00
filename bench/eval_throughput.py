"""Throughput of the batched strided loop against a naive one-window-at-a-time loop.

Both run in this process on the same weights and text. The naive loop is the reference's way
(``eval_lm.py``): one forward per stride over all its candidates, logits for every position, GPT-2's
own ``gelu_new``; the batched loop runs the model as ``ralm.loading.load_causal_lm`` loads it (fused GELU).
Prints target tokens/s for each and the ratio. Usage::

    python bench/eval_throughput.py                      # 2-layer 128-wide GPT-2, 50,257 vocab, CPU
    python bench/eval_throughput.py --size small --device cuda   # GPT-2-small-sized, random weights
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_text_and_tokenizer
from bench.naive_eval import naive_nll
from eval.predict import run_loop
from ralm.retrieval import Passage
from ralm.selectors import BUILTIN
from ralm.settings import Devices, Scoring, Windows
from ralm.windows import stride_windows

NAIVE_RANKING = {"none": "none", "bm25": "first", "zero-shot": "logprob", "oracle": "oracle"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "small"], default="tiny", help="tiny: 2x128; small: GPT-2 small (12x768)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--stride", type=int, default=32)
    p.add_argument("--strides", type=int, default=24, help="strides to score after the first window")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--rerankers", default="bm25,zero-shot")
    args = p.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    text, tok, _, _ = load_text_and_tokenizer(Path(tempfile.mkdtemp(prefix="eval_bench_")))
    dims = dict(n_layer=2, n_embd=128, n_head=2) if args.size == "tiny" else dict(n_layer=12, n_embd=768, n_head=12)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, attn_implementation="sdpa", **dims))
    model = model.eval().to(args.device)  # the reference's model: GPT-2's own gelu_new
    # the project's: the same weights with the fused GELU that ralm.loading.load_causal_lm swaps in
    fused = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, attn_implementation="sdpa",
                                       activation_function="gelu_pytorch_tanh", **dims))
    fused.load_state_dict(model.state_dict())
    fused = fused.eval().to(args.device)
    n_tokens = args.max_length + args.stride * args.strides
    ids = tok(text, add_special_tokens=False)["input_ids"][:n_tokens]
    rng = random.Random(0)
    paras = [x.strip() for x in text.split("\n") if len(x.split()) > 60]
    windows = stride_windows(len(ids), args.stride, args.max_length)
    cands = [[Passage(f"{i}-{j}", "", rng.choice(paras), 0.0) for j in range(args.k)] for i in range(len(windows))]
    scored = len(ids) - args.max_length  # targets of strides with retrieval
    print(f"model {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, vocab 50,257) on "
          f"{args.device}; L={args.max_length}, stride={args.stride}, {len(windows) - 1} strides, k={args.k}, "
          f"batch {args.batch_size}")
    for name in args.rerankers.split(","):
        t = time.perf_counter()
        docs = [[c.document() for c in row] for row in cands]
        naive, _ = naive_nll(model, tok, ids, docs, NAIVE_RANKING[name], args.stride, args.max_length)
        t_naive = time.perf_counter() - t
        t = time.perf_counter()
        res = run_loop(ids, tok, fused, BUILTIN[name](), lambda run: [cands[w.index] for w in run],
                       windows=Windows(stride=args.stride, max_length=args.max_length),
                       scoring=Scoring(batch_size=args.batch_size), k=args.k,
                       strides_per_chunk=max(args.batch_size, 16), devices=Devices(args.device, 1))
        t_fast = time.perf_counter() - t
        agree = abs(res.nll_sum - naive) / abs(naive)
        print(f"{name:>10}: naive {scored / t_naive:9.1f} tok/s | batched {scored / t_fast:9.1f} tok/s | "
              f"speed-up {t_naive / t_fast:5.1f}x | relative NLL difference {agree:.1e}")


if __name__ == "__main__":
    main()
