"""How close LM scoring gets to this CPU's matmul rate (model-FLOP utilisation), and what the GELU costs.

    python bench/cpu_limit.py                    # GPT-2-small shape (12 x 768), rows of 1,024 tokens
    python bench/cpu_limit.py --rows 8 --repeats 5

Scores rows with ``ralm.scoring.LMScorer`` (what data generation and evaluation run: LM head on the
scored positions only, SDPA) on a random-weight GPT-2-small-shaped model, once with GPT-2's own
``gelu_new`` and once with torch's fused tanh GELU (what ``ralm.loading.load_causal_lm`` swaps in), and
times a GEMM of the model's MLP shape in the same process, alternating, ``--repeats`` times. Model
FLOPs per token = 2 x (non-embedding parameters) + causal attention (2 x layers x L x width) + the
LM head on scored positions; utilisation = those FLOPs / time / the best GEMM rate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4, help="rows of --max-length tokens per forward")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--scored", type=int, default=32, help="scored positions per row (the stride)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)

    from transformers import GPT2Config, GPT2LMHeadModel

    from ralm.scoring import LMScorer

    torch.manual_seed(0)
    L, R, s, d, layers, V = a.max_length, a.rows, a.scored, 768, 12, 50257
    models = {}
    for act in ("gelu_new", "gelu_pytorch_tanh"):
        cfg = GPT2Config(vocab_size=V, n_positions=max(L, 1024), n_layer=layers, n_embd=d, n_head=12,
                         activation_function=act, attn_implementation="sdpa")
        models[act] = GPT2LMHeadModel(cfg).eval().requires_grad_(False)
    models["gelu_pytorch_tanh"].load_state_dict(models["gelu_new"].state_dict())
    body = sum(p.numel() for n, p in models["gelu_new"].transformer.named_parameters() if n.split(".")[0] == "h")
    flops = R * L * (2 * body + 2 * layers * L * d) + R * (s + 1) * 2 * d * V
    ids = torch.randint(0, V, (R, L))
    scorers = {act: LMScorer(m, batch_size=R, dtype="float32") for act, m in models.items()}
    x, w = torch.randn(R * L, d), torch.randn(d, 4 * d)

    def gemm() -> float:
        t = time.perf_counter()
        for _ in range(10):
            x @ w
        return 10 * 2 * R * L * d * 4 * d / (time.perf_counter() - t)

    nll = {act: sc.nll(ids, ids, s) for act, sc in scorers.items()}  # warm-up, and the two must agree
    diff = (nll["gelu_new"] - nll["gelu_pytorch_tanh"]).abs().max().item()
    peaks, times = [], {act: [] for act in scorers}
    for _ in range(a.repeats):
        peaks.append(gemm())
        for act, sc in scorers.items():
            t = time.perf_counter()
            sc.nll(ids, ids, s)
            times[act].append(time.perf_counter() - t)
    peak = max(peaks)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GPT-2-small shape ({layers} x {d}, "
          f"vocab {V:,}), {R} rows x {L} tokens, {s} scored per row; max |NLL difference| {diff:.1e}")
    print(f"matmul ({R * L} x {d}) @ ({d} x {4 * d}): best {peak / 1e9:.1f} GFLOP/s "
          f"(all: {', '.join(f'{p / 1e9:.1f}' for p in peaks)})")
    for act, ts in times.items():
        t = min(ts)
        print(f"  LMScorer, {act:18s} best {t:5.2f} s  {R * L / t:7,.0f} tokens/s  {flops / t / 1e9:6.1f} GFLOP/s "
              f"= {100 * flops / t / peak:3.0f}% of the matmul rate  (all: {', '.join(f'{x:.2f}' for x in ts)})")
    print(f"  fused GELU speed-up: {min(times['gelu_new']) / min(times['gelu_pytorch_tanh']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
