"""Reranker training throughput: dynamic padding vs padding every pair to max_length.

    python bench/train_throughput.py [--steps 6] [--batch 4] [--k 16]

Builds a small RoBERTa offline (ralm.tiny), makes realistic (prefix, passage) pairs from pseudo-WikiText
(prefixes of varying length, ~100-word passages), and times full training steps (forward + backward +
AdamW) on batches of the project's collator in both padding modes, in one process; batches are collated
before the clock starts and the collator's own time is printed beside. With a GPU it also times a
RoBERTa-base-sized encoder in bf16 and reports model-FLOPs utilisation and the projected time of the
paper's 10,000 steps x 32 examples x 16 candidates.
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

from bench.common import bf16_peak  # noqa: E402
from ralm.tiny import make_roberta, train_tokenizer, wikitext_articles  # noqa: E402
from reranking.data import RerankCollator  # noqa: E402
from reranking.inputs import InputFormat  # noqa: E402
from reranking.loss import MarginalLikelihoodLoss  # noqa: E402
from reranking.model import CrossEncoder  # noqa: E402


def make_rows(n, k, seed=0):
    rng = random.Random(seed)
    words = wikitext_articles(n_articles=20, seed=seed).split()

    def text(m):
        s = rng.randrange(len(words) - m)
        return " ".join(words[s: s + m])

    # Prefix: the decode of up to L - s = 1020 LM tokens; early positions of an article have less.
    return [{"id": i, "prefix_text": text(rng.choice([20, 60, 150, 400, 800])),
             "doc_texts": [f"{text(2)}\n{text(100)}" for _ in range(k)],
             "lm_logprobs": [rng.uniform(-40, -10) for _ in range(k)], "nodoc_logprob": -30.0} for i in range(n)]


def time_steps(model, collate, rows, batch, steps, device, autocast_dtype=None):
    """``(pairs/s, tokens/s, seconds)`` of ``steps`` training steps (forward, backward, AdamW) after one
    warm-up step, and ``collate_s``: the collator's seconds per step, timed on its own. Batches are
    collated before the clock starts, as ``reranking.fit``'s loader workers collate while the device
    computes: on a GPU, tokenizing 32 x 16 pairs in the loop was ~a fifth of a RoBERTa-base step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    loss_fn = MarginalLikelihoodLoss()
    t = time.perf_counter()
    batches = [collate(rows[(step * batch) % len(rows):][:batch]) for step in range(steps + 1)]
    collate_s = (time.perf_counter() - t) / (steps + 1)
    pairs = tokens = 0
    t0 = None
    for step, b in enumerate(batches):  # step 0 is warm-up
        if step == 1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        b = {k: v.to(device) for k, v in b.items()}
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            f = model(b["input_ids"], b["attention_mask"])
        scores = torch.full(b["mask"].shape, float("-inf"), device=device).masked_scatter(b["mask"], f)
        loss = loss_fn(scores, b["lm_logprobs"], b["mask"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 1:
            pairs += b["input_ids"].shape[0]
            tokens += b["input_ids"].numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return pairs / dt, tokens / dt, dt, collate_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4, help="examples per step (each with k candidates)")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    fmt = InputFormat(max_length=512, max_prefix_tokens=256)
    rows = make_rows(64, args.k)
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer([wikitext_articles(20)], tmp, vocab_size=2000, kind="roberta")
        make_roberta(tmp, tok, num_hidden_layers=args.layers, hidden_size=args.hidden,
                     num_attention_heads=max(1, args.hidden // 64))
        dev = torch.device("cpu")
        print(f"CPU, RoBERTa {args.layers}x{args.hidden}, {args.batch} examples x {args.k} candidates per step, "
              f"max_length {fmt.max_length}, {torch.get_num_threads()} threads")
        res = {}
        for padding in ("longest", "max_length"):
            model = CrossEncoder(tmp, pretrained=True).train()
            res[padding] = time_steps(model, RerankCollator(tok, fmt, args.k, padding=padding), rows, args.batch,
                                      args.steps, dev)
            pps, tps, dt, coll = res[padding]
            print(f"  padding={padding:<10s} {pps:8.1f} pairs/s  {tps:10.0f} tokens/s  ({args.steps} steps, {dt:.1f} s; "
                  f"collation {coll:.3f} s a step)")
        print(f"  dynamic / max_length speed-up: {res['longest'][0] / res['max_length'][0]:.2f}x")

        if torch.cuda.is_available():
            from transformers import RobertaConfig

            dev = torch.device("cuda")
            name = torch.cuda.get_device_name()
            peak = bf16_peak(name)
            cfg = RobertaConfig(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                intermediate_size=3072, max_position_embeddings=514, pad_token_id=tok.pad_token_id)
            torch.backends.cuda.matmul.allow_tf32 = True
            gpu_batch = 32
            print(f"{name}: RoBERTa-base-sized encoder, bf16 autocast, {gpu_batch} examples x {args.k} candidates")
            for padding in ("longest", "max_length"):
                model = CrossEncoder(config=cfg).to(dev).train()
                n_params = sum(p.numel() for p in model.parameters() if p.dim() > 1) - 50265 * 768
                pps, tps, dt, coll = time_steps(model, RerankCollator(tok, fmt, args.k, padding=padding), rows * 8,
                                                gpu_batch, args.steps, dev, torch.bfloat16)
                mfu = 6 * n_params * tps / (peak * 1e12) if peak else float("nan")
                step_s = gpu_batch * args.k / pps
                print(f"  padding={padding:<10s} {pps:8.0f} pairs/s  {tps:10.0f} tokens/s  MFU {100 * mfu:.1f}% "
                      f"(6·N·tokens, N={n_params / 1e6:.0f}M non-embedding, peak {peak} TFLOPS)  "
                      f"10k steps ≈ {10_000 * step_s / 3600:.2f} h; collation {coll:.3f} s a step on the host")


if __name__ == "__main__":
    main()
