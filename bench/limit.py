"""How close each stage gets to the hardware, what the paper-scale jobs would take, and the reference ratio.

    python bench/limit.py                   # CPU, all three parts (~20 min on 2 cores)
    python bench/limit.py --skip-naive      # parts 1-2 only (~4 min)
    python bench/limit.py --device cuda     # on a GPU: bf16 autocast, MFU against the device's bf16 peak

1. Peak: the best GEMM rate in this process (on CPU float32, the best of 10 timings of each of five
   shapes, with the spread printed; on GPU bf16 8192^3, next to the data-sheet bf16 peak, which is what
   GPU MFU is taken against).
2. Model-FLOP utilisation of each stage on GPT-2-small-sized random weights, loaded the way the project
   loads a model (``ralm.loading.load_causal_lm``: fused GELU, SDPA) and scored through
   ``ralm.scoring.LMScorer`` with the stage's row shape (L = 1,024, stride 4):
   eval none (windows, 4 targets each), eval zero-shot k = 16 (16 candidate rows per stride, s' + s = 20
   positions), data generation (16 + 1 rows per example, 4 targets); and reranker training (a RoBERTa-
   base-sized cross-encoder, the project's collator, loss and AdamW; with the paper's dropout 0.1, which
   the projections use, and again with dropout 0, as the demo trains MiniLM). FLOPs: forward 2 N + causal
   attention 2 x layers x L x d per token + the LM head on the scored positions; training 6 N per
   (padded) token. Then the paper-scale jobs' time at the measured rate.
3. The reference loop (bench/naive_eval.py: one window per forward, logits everywhere) against
   ``python -m eval.ppl``, both as whole processes (start-up counts), on the tiny model (2 x 128, real
   50,257-token vocabulary, L 1,024, stride 4): none and zero-shot k = 16 on the same text and
   candidates; then none at GPT-2-small size (12 x 768), where the LM head is a small share of the
   FLOPs and the same levers are worth far less. Their NLL sums must agree.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import bf16_peak, load_text_and_tokenizer  # noqa: E402
from ralm.tiny import make_gpt2  # noqa: E402

WT103_TEST_TOKENS = 286_221  # GPT-2 tokens of WikiText-103 test (= WikiText-2 test)
STRIDE, L, K, S_PRIME = 4, 1024, 16, 16


def timed(fn, repeats: int, sync) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


#: CPU GEMM shapes (M, K, N) the peak is the best of: GPT-2-small's MLP up and down projections at 4
#: rows of L tokens, its attention projection, and two squarer shapes that BLAS kernels favour.
CPU_GEMMS = ((4 * L, 768, 3072), (4 * L, 3072, 768), (4 * L, 768, 768), (2048, 2048, 2048), (4096, 1024, 4096))


def gemm_peak(device: torch.device, sync, repeats: int = 10) -> float:
    """The best GEMM rate (FLOP/s) measured in this process: on CPU float32 over ``CPU_GEMMS``, each timed
    ``repeats`` times; the spread (per-shape best and median, and the worst timing) is printed, because a
    single shape's best-of-3 moved between 157 and 182 GFLOP/s from run to run on the same machine."""
    if device.type == "cuda":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        n, flops = 10, 2 * 8192 ** 3
        return n * flops / timed(lambda: [a @ b for _ in range(n)], 3, sync)
    rates = []
    for m, k, n in CPU_GEMMS:
        a, b = torch.randn(m, k), torch.randn(k, n)
        a @ b  # warm-up
        shape = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(5):
                a @ b
            shape.append(5 * 2 * m * k * n / (time.perf_counter() - t))
        shape.sort()
        print(f"  GEMM {m}x{k} @ {k}x{n}: best {shape[-1] / 1e9:6.1f}, median {shape[len(shape) // 2] / 1e9:6.1f}, "
              f"worst {shape[0] / 1e9:6.1f} GFLOP/s ({repeats} timings of 5 products)")
        rates += shape
    best = max(rates)
    print(f"  GEMM peak = best of all {len(rates)} timings: {best / 1e9:.1f} GFLOP/s; the median timing is "
          f"{100 * sorted(rates)[len(rates) // 2] / best:.0f}% of it, the worst {100 * min(rates) / best:.0f}%")
    return best


def lm_part(device: torch.device, sync, peak: float, repeats: int, tmp: Path, tokenizer) -> dict:
    """Tokens/s and MFU of LM scoring for each stage's row shape; returns FLOP/s per stage."""
    from ralm.loading import load_causal_lm
    from ralm.scoring import LMScorer

    path = tmp / "gpt2-small"
    make_gpt2(path, tokenizer, n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
    model, _ = load_causal_lm(str(path), device=str(device))
    layers, d, V = 12, 768, model.config.vocab_size
    body = sum(p.numel() for n, p in model.transformer.named_parameters() if n.split(".")[0] == "h")

    def row_flops(n_scored: int) -> float:
        return L * (2 * body + 2 * layers * L * d) + 2 * d * V * n_scored

    gpu = device.type == "cuda"  # a GPU gets the row counts of the paper configs (ppl.yaml, build.yaml)
    shapes = {"eval none": (32 if gpu else 4, STRIDE), "eval zero-shot k=16": (K * (4 if gpu else 1), S_PRIME + STRIDE),
              "data generation": ((K + 1) * (8 if gpu else 1), STRIDE)}
    rates = {}
    gen = torch.Generator().manual_seed(0)
    for name, (rows, n_scored) in shapes.items():
        ids = torch.randint(0, V, (rows, L), generator=gen)
        scorer = LMScorer(model, batch_size=rows)
        t = timed(lambda: scorer.nll(ids, ids, n_scored), repeats, sync)
        rates[name] = rows * row_flops(n_scored) / t
        print(f"  {name:22s} {rows:4d} rows x {L} tokens, {n_scored:2d} scored: {rows * L / t:9,.0f} tokens/s "
              f"{rates[name] / 1e9:9.1f} GFLOP/s  MFU {100 * rates[name] / peak:5.1f}%")
    rates["_row_flops"] = row_flops
    del model
    return rates


def train_part(device: torch.device, sync, peak: float, tmp: Path, dropout: float | None = None
               ) -> tuple[float, float, int]:
    """Reranker training step rate: (FLOP/s, padded tokens per pair, non-embedding parameters). ``dropout``
    replaces RoBERTa's 0.1 on attention probabilities and hidden states (``None``: the paper's model as it
    is): on a CPU drawing the masks, and attention's unfused path with them, are much of a step."""
    from transformers import RobertaConfig

    from bench.train_throughput import make_rows, time_steps
    from ralm.tiny import train_tokenizer, wikitext_articles
    from reranking.data import RerankCollator
    from reranking.inputs import InputFormat
    from reranking.model import CrossEncoder

    tok = train_tokenizer([wikitext_articles(20)], tmp / "roberta-tok", vocab_size=2000, kind="roberta")
    cfg = RobertaConfig(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=514, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = CrossEncoder(config=cfg, attention_dropout=dropout, hidden_dropout=dropout).to(device).train()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    batch, steps = (32, 4) if device.type == "cuda" else (1, 2)
    rows = make_rows(max(64, batch * (steps + 1)), K)
    pps, tps, _, collate_s = time_steps(model, RerankCollator(tok, InputFormat(), K), rows, batch, steps, device,
                                        torch.bfloat16 if device.type == "cuda" else None)
    rate = 6 * n_params * tps
    label = "reranker training" + ("" if dropout is None else f", dropout {dropout:g}")
    print(f"  {label:22s} {batch:4d} x {K} pairs, RoBERTa-base size ({n_params / 1e6:.0f}M non-embedding): "
          f"{tps:9,.0f} tokens/s {rate / 1e9:9.1f} GFLOP/s  MFU {100 * rate / peak:5.1f}%  (collated beforehand, as "
          f"the fit's loader workers do: {collate_s:.3f} s a step, {100 * collate_s * pps / (batch * K):.0f} % of the step)")
    return rate, tps / pps, n_params


def projections(rates: dict, train_rate: float, tokens_per_pair: float, train_params: int) -> None:
    from ralm.windows import stride_windows

    windows = len(stride_windows(WT103_TEST_TOKENS, STRIDE, L))
    f = rates["_row_flops"]
    jobs = [("eval none, WikiText-103 test", windows * f(STRIDE), rates["eval none"]),
            ("eval zero-shot k=16", windows * K * f(S_PRIME + STRIDE), rates["eval zero-shot k=16"]),
            ("data generation, 300k examples", 300_000 * (K + 1) * f(STRIDE), rates["data generation"]),
            ("training, 10k steps x 32 x 16", 6 * train_params * 10_000 * 32 * K * tokens_per_pair, train_rate)]
    print(f"paper-scale jobs on this device at the rates above (GPT-2 small, L {L}, stride {STRIDE}; "
          f"{windows:,} windows; training at {tokens_per_pair:.0f} padded tokens per pair):")
    for name, flops, rate in jobs:
        print(f"  {name:32s} {flops / 1e15:8.1f} PFLOP  {flops / rate / 3600:10.1f} h")


#: part 3's models: (label, layers, width, heads). The tiny one's LM head is most of its FLOPs, so skipping
#: the head on unscored positions is worth ~10x there; at GPT-2-small size the head is a small share.
NAIVE_MODELS = (("tiny GPT-2 2 x 128", 2, 128, 2), ("GPT-2-small size 12 x 768", 12, 768, 12))


def naive_part(tmp: Path, text: str, tokenizer, strides: dict[str, dict[str, int]], batch_size: int | None) -> None:
    """The reference loop against ``eval.ppl`` as whole processes, for each model of ``NAIVE_MODELS``
    (``strides[label][reranker]``: strides to run; 0 skips)."""
    print(f"reference loop (bench/naive_eval.py) vs python -m eval.ppl, whole processes; random GPT-2 weights, "
          f"vocab 50,257, L {L}, stride {STRIDE}, {torch.get_num_threads()} threads:")
    for label, n_layer, n_embd, n_head in NAIVE_MODELS:
        model_dir = tmp / f"gpt2-{n_layer}x{n_embd}"
        make_gpt2(model_dir, tokenizer, n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=50257)
        for name, n in strides[label].items():
            if n > 0:
                _naive_row(tmp, model_dir, label, name, n, text, tokenizer, batch_size)


def _naive_row(tmp: Path, model_dir: Path, label: str, name: str, strides: int, text: str, tokenizer,
               batch_size: int | None) -> None:
    from ralm.retrieval import Passage, reference_entry, write_reference_json
    from ralm.windows import stride_windows

    paras = [x.strip() for x in text.split("\n") if len(x.split()) > 60]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    text_file = tmp / f"{name}.txt"
    text_file.write_text(tokenizer.decode(ids[:L + STRIDE * strides]), encoding="utf-8")
    n = len(tokenizer(text_file.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"])
    out_dir = tmp / f"ppl-{model_dir.name}-{name}"
    naive = [sys.executable, str(ROOT / "bench" / "naive_eval.py"), "--model", str(model_dir), "--text",
             str(text_file), "--stride", str(STRIDE), "--max-length", str(L)]
    ours = [sys.executable, "-m", "eval.ppl", "--model", str(model_dir), "--text.file", str(text_file),
            "--reranker", name, "--windows.stride", str(STRIDE), "--windows.max_length", str(L),
            "--windows.zero_shot_tokens", str(S_PRIME), "--retrieval.k", str(K), "--progress", "false",
            "--output_dir", str(out_dir)]
    if batch_size:
        ours += ["--scoring.batch_size", str(batch_size)]
    if name == "zero-shot":
        rng = random.Random(0)
        entries = [reference_entry(w.target_begin, w.end, "", "", [] if w.index == 0 else
                                   [Passage(f"{w.index}-{j}", f"T{rng.randrange(99)}", rng.choice(paras), 0.0)
                                    for j in range(K)]) for w in stride_windows(n, STRIDE, L)]
        write_reference_json(tmp / "retrieval.json", entries)
        naive += ["--retrieval-file", str(tmp / "retrieval.json"), "--ranking", "logprob", "--num-docs", str(K),
                  "--rank-tokens", str(S_PRIME)]
        ours += ["--retrieval_file", str(tmp / "retrieval.json")]
    t = time.perf_counter()
    out = subprocess.run(naive, capture_output=True, text=True, check=True, cwd=ROOT)
    t_naive = time.perf_counter() - t
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    t = time.perf_counter()
    subprocess.run(ours, capture_output=True, text=True, check=True, cwd=ROOT)
    t_ours = time.perf_counter() - t
    res = json.loads((out_dir / "results.json").read_text())
    if res["n_scored_tokens"] != ref["n_scored_tokens"]:
        raise SystemExit(f"{name}: scored tokens differ: {res['n_scored_tokens']} vs {ref['n_scored_tokens']}")
    diff = abs(res["nll_sum"] - ref["nll_sum"]) / abs(ref["nll_sum"])
    print(f"  {label}, {name:10s} {res['n_strides']:5d} strides: reference {t_naive:7.1f} s (its loop "
          f"{ref['loop_seconds']:.1f}) | eval.ppl {t_ours:6.1f} s (in its run {res['seconds']:.1f}) | "
          f"{t_naive / t_ours:5.1f}x whole process | NLL relative difference {diff:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per LM shape (best is kept)")
    ap.add_argument("--skip-naive", action="store_true", help="skip part 3 (the reference loop)")
    ap.add_argument("--only-naive", action="store_true", help="run part 3 only")
    ap.add_argument("--none-strides", type=int, default=1000, help="strides of part 3's no-retrieval run")
    ap.add_argument("--zero-shot-strides", type=int, default=30, help="strides of part 3's zero-shot run")
    ap.add_argument("--small-strides", type=int, default=60,
                    help="strides of part 3's no-retrieval run at GPT-2-small size (0 skips it)")
    ap.add_argument("--batch-size", type=int, help="eval.ppl --scoring.batch_size in part 3 (default: its own)")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        text, tokenizer, _, _ = load_text_and_tokenizer(tmp)
        if not a.only_naive:
            peak = gemm_peak(device, sync)
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
            print(f"torch {torch.__version__} on {name}, {torch.get_num_threads()} threads; "
                  f"measured GEMM {peak / 1e12:.3f} TFLOP/s ({'bf16' if device.type == 'cuda' else 'float32'})")
            if device.type == "cuda":
                sheet = bf16_peak(name)
                if sheet is None:
                    raise SystemExit(f"no data-sheet bf16 peak known for {name!r}; add it to "
                                     "bench/common.py PEAK_BF16_TFLOPS")
                print(f"MFU below is against the data-sheet bf16 peak, {sheet:.0f} TFLOP/s")
                peak = sheet * 1e12
            else:
                print("MFU below is against that measured GEMM rate")
            rates = lm_part(device, sync, peak, a.repeats, tmp, tokenizer)
            train = train_part(device, sync, peak, tmp)  # the paper's model, dropout 0.1: the projections'
            train_part(device, sync, peak, tmp, dropout=0.0)  # what the same step costs without the masks
            projections(rates, *train)
        if not a.skip_naive and device.type == "cpu":
            tiny, small = (label for label, *_ in NAIVE_MODELS)
            naive_part(tmp, text, tokenizer, {tiny: {"none": a.none_strides, "zero-shot": a.zero_shot_strides},
                                              small: {"none": a.small_strides}}, a.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
