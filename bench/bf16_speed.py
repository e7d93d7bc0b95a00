"""bf16 against float32 on the machine at hand, for the two kinds of work: LM scoring and reranker training.

    python bench/bf16_speed.py [--repeats 3]

Side by side in one process, alternating, best of ``--repeats``: (1) ``LMScorer`` on SmolLM2-135M (the
real model when ``python -m ralm.models fetch smollm2-135m`` has run, else a random Llama of its shape),
8 rows x 256 tokens, 32 scored; (2) one training step (forward + backward + AdamW) of the all-MiniLM-L6-v2
bi-encoder (real or random BERT of its shape), 16 examples x 8 candidates, prefixes 64 and passages 128
tokens. Prints the CPU model and flags, what ``auto`` resolves to here (``ralm.precision``), both times and
the bf16 / float32 speed ratio, so the choice can be checked on any machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ralm.precision import cpu_description, resolve  # noqa: E402
from ralm.scoring import autocast_for  # noqa: E402


def smollm_or_shape():
    from ralm.loading import load_causal_lm
    from ralm.models import ModelError

    try:
        model, _ = load_causal_lm("smollm2-135m", "cpu")
        return model, "SmolLM2-135M (real)"
    except (ModelError, OSError, ValueError):
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
        return LlamaForCausalLM(cfg).eval(), "random Llama of SmolLM2-135M's shape"


def minilm_or_shape():
    from reranking.model import make_model

    try:
        return make_model("bi", "minilm-l6", pretrained=True, temperature=0.05), "all-MiniLM-L6-v2 (real)"
    except (OSError, ValueError):
        from transformers import BertConfig

        from reranking.model import BiEncoder

        cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        return BiEncoder("bert", pretrained=False, config=cfg, temperature=0.05), "random BERT of MiniLM-L6's shape"


def time_scoring(model, dtype: str) -> float:
    x = torch.randint(100, 40000, (8, 256))
    t = time.perf_counter()
    with torch.inference_mode(), autocast_for(torch.device("cpu"), dtype):
        model(input_ids=x, logits_to_keep=33, use_cache=False)
    return time.perf_counter() - t


def time_training(model, opt, dtype: str) -> float:
    g = torch.Generator().manual_seed(0)
    prefix = {"input_ids": torch.randint(1000, 30000, (16, 64), generator=g), "attention_mask": torch.ones(16, 64, dtype=torch.long)}
    passage = {"input_ids": torch.randint(1000, 30000, (128, 128), generator=g),
               "attention_mask": torch.ones(128, 128, dtype=torch.long)}
    t = time.perf_counter()
    with autocast_for(torch.device("cpu"), dtype):
        q = model.embed(**prefix)        # (16, 384)
        p = model.embed(**passage)       # (128, 384)
        scores = (q.unsqueeze(1) * p.view(16, 8, -1)).sum(-1) / 0.05  # (16, 8)
    loss = -torch.logsumexp(scores.float().log_softmax(-1), -1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    print(f"CPU: {cpu_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"auto resolves to: {resolve('auto', 'cpu').describe('auto')}")
    lm, lm_name = smollm_or_shape()
    enc, enc_name = minilm_or_shape()
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    best = {}
    for what, fn in (("LM scoring, " + lm_name + ", 8 x 256 tokens", lambda d: time_scoring(lm, d)),
                     ("training step, " + enc_name + ", 16 x 8 bi-encoder", lambda d: time_training(enc, opt, d))):
        fn("float32"), fn("bfloat16")  # warm-up (oneDNN primitive creation)
        for _ in range(a.repeats):
            for d in ("float32", "bfloat16"):
                best[what, d] = min(best.get((what, d), float("inf")), fn(d))
        f, b = best[what, "float32"], best[what, "bfloat16"]
        print(f"{what}: float32 {f:.2f} s, bf16 {b:.2f} s -> bf16 is {f / b:.2f}x float32's speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
