"""What a reranker training step costs, and what six settings save: ``--model.attention_dropout 0``,
``--model.passage_grad false``, ``--model.frozen_passages true`` (timed with its cache of passage
embeddings already filled, as after the first pass over a training set), shorter passages
(``--model.max_passage_tokens 64``), fewer candidates (``--data.max_candidates 4``; the last two with
attention dropout 0) and ``--model.hidden_dropout 0`` with 48-token passages (as ``configs/demo/fit.yaml``
has them).

    python bench/fit_step.py [--repeats 4] [--data data/real/smollm2-wt2] [--precision auto]

The real step (``RerankerSystem.score_batch`` and its loss: the project's collator, the all-MiniLM-L6-v2
bi-encoder with the real-text recipe's settings, marginal-likelihood loss, backward, AdamW) on batches of
16 examples x 8 candidates (prefixes 64, passages 128 MiniLM tokens) from the committed real-text training
data (or ``--data DIR``: the demo's, built with ``--retrieval.k 8``), the settings alternating in one process, median and best of
``--repeats``. Every model starts from the same weights and sees the same batches. Prints the CPU model and
flags, the load average before and after, and each setting's speed against the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ralm.precision import cpu_description, resolve  # noqa: E402
from ralm.scoring import autocast_for  # noqa: E402


def row_batches(data: Path, n: int, batch_size: int = 16) -> list[list[dict]]:
    import pyarrow.parquet as pq

    from reranking.data import parquet_files

    rows = pq.read_table(parquet_files(data)[0]).to_pylist()[: n * batch_size]
    return [rows[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def step_seconds(system, opt, batch, dtype) -> float:
    t = time.perf_counter()
    with autocast_for(torch.device("cpu"), dtype):
        scores = system.score_batch(batch)
    loss = system.loss_fn(scores, batch["lm_logprobs"], batch["mask"])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "real" / "smollm2-wt2")
    ap.add_argument("--precision", default="auto", help="auto, float32 or bfloat16")
    a = ap.parse_args(argv)
    from reranking.data import RerankCollator
    from reranking.system import RerankerSystem

    batches = row_batches(a.data, a.repeats + 1)
    if min(len(r["doc_texts"]) for b in batches for r in b) < 8:
        ap.error(f"--data {a.data}: some examples hold fewer than the 8 candidates the variants read; build the "
                 "data with --retrieval.k 8 or more (the demo's configs/demo/build.yaml stores 4)")
    dtype = resolve(a.precision, "cpu").dtype
    print(f"CPU: {cpu_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"compute {dtype}; load average {os.getloadavg()[0]:.2f}", flush=True)
    settings = dict(encoder="minilm-l6", architecture="bi", max_prefix_tokens=64, max_passage_tokens=128,
                    cosine_temperature=0.05, bm25_weight=1.0, lr=5e-5, warmup_steps=0, total_steps=1000)
    no_attn_dropout = {"attention_dropout": 0.0}
    variants = {  # name: (RerankerSystem settings, candidates per example)
        "default (dropout 0.1 everywhere, passages with gradient)": ({}, 8),
        "attention_dropout 0": (no_attn_dropout, 8),
        "passage_grad false": ({"passage_grad": False}, 8),
        "frozen_passages true (cache filled)": ({"frozen_passages": True}, 8),
        "attention_dropout 0, passages 64 tokens": ({**no_attn_dropout, "max_passage_tokens": 64}, 8),
        "attention_dropout 0, passages 64 tokens, 4 candidates (the demo's until 7d203b7)":
            ({**no_attn_dropout, "max_passage_tokens": 64}, 4),
        "attention and hidden dropout 0, passages 48 tokens, 4 candidates (the demo's)":
            ({**no_attn_dropout, "hidden_dropout": 0.0, "max_passage_tokens": 48}, 4)}
    systems = {name: RerankerSystem(**{**settings, **kw}) for name, (kw, _) in variants.items()}
    first = next(iter(systems.values()))
    for s in systems.values():
        s.model.encoder.load_state_dict(first.model.encoder.state_dict())
        if getattr(s.model, "passage_encoder", None) is not None:
            s.model.passage_encoder.load_state_dict(first.model.encoder.state_dict())
    opts = {name: torch.optim.AdamW(s.model.parameters(), lr=5e-5) for name, s in systems.items()}
    for name, s in systems.items():
        if getattr(s.model, "frozen_passages", False):  # each passage is embedded once a run: fill the cache
            for rows in batches:
                b = RerankCollator(s.tokenizer, s.fmt, max_candidates=variants[name][1])(rows)
                with autocast_for(torch.device("cpu"), dtype):
                    s.model._frozen_embeddings(b["passage_input_ids"], b["passage_attention_mask"])
    times = {name: [] for name in systems}
    for i, rows in enumerate(batches):
        for name, s in systems.items():
            batch = RerankCollator(s.tokenizer, s.fmt, max_candidates=variants[name][1])(rows)
            t = step_seconds(s, opts[name], batch, dtype)
            if i:  # the first step of each is warm-up (oneDNN primitives, allocator)
                times[name].append(t)
    base = statistics.median(times[next(iter(times))])
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.2f} s, best {min(t):.2f} s per step -> "
              f"{base / statistics.median(t):.2f}x the default's speed", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
