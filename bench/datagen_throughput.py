"""Throughput of data_gen's stages: BM25 retrieval (queries/s) and LM scoring (examples/s, tokens/s).

    python bench/datagen_throughput.py                      # CPU: tiny GPT-2 (2 x 128, 50,257 vocab)
    python bench/datagen_throughput.py --examples 8 --max-length 1024
    python bench/datagen_throughput.py --gpu-examples 64    # + GPT-2-small size on CUDA when present

Scoring compares data_gen's batched scorer (all k+1 rows of several examples per forward, LM head
only on the s target positions, ``ralm.scoring.LMScorer``) with a naive loop that runs one
(document, prefix) row at a time through Hugging Face with full logits — what the reference
``eval_lm.py`` does — on the same random-weight model and the same rows, and checks they agree.
One example = k document rows + 1 no-document row of L tokens; "LM tokens" counts all of them.
The text is WikiText-2 test (../shared/data) when present, else pseudo-WikiText; the BM25 index
is built from the same text (100-word passages) in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import bf16_peak, load_text_and_tokenizer  # noqa: E402


def gpt2(n_layer: int, n_embd: int, n_head: int, n_positions: int, device: str):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    model = GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "sdpa"
    return model.eval().requires_grad_(False).to(device)


def build_rows(examples, tokens, window: int, stride: int, doc_max_tokens: int, tokenizer):
    """(inputs, labels) of all rows: per example its candidates then the no-document row."""
    import numpy as np
    import torch

    from ralm.scoring import DocumentEncoder, condition_on_documents

    enc = DocumentEncoder(tokenizer, doc_max_tokens)
    windows, docs = [], []
    for p, passages in examples:
        w = torch.from_numpy(np.asarray(tokens[p - (window - stride):p + stride], dtype=np.int64))
        d = enc([x.document() for x in passages])
        windows += [w] * (len(d) + 1)
        docs += list(d) + [None]
    labels = torch.stack(windows)
    return condition_on_documents(labels, docs), labels


def naive_logprobs(model, inputs, labels, stride: int):
    """One row per forward, full logits (the reference's way)."""
    import torch

    out = []
    with torch.inference_mode():
        for x, y in zip(inputs, labels):
            logits = model(input_ids=x[None]).logits[0].float()  # (L, V): every position
            logp = torch.log_softmax(logits, dim=-1)
            w = x.numel()
            out.append(sum(logp[w - stride - 1 + i, y[w - stride + i]] for i in range(stride)).item())
    return torch.tensor(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=6, help="examples scored on CPU (x (k+1) rows each)")
    ap.add_argument("--queries", type=int, default=500, help="BM25 queries for the retrieval benchmark")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--query-tokens", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--doc-max-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=34, help="rows per forward in the batched scorer")
    ap.add_argument("--gpu-examples", type=int, default=64, help="examples for the GPT-2-small GPU run")
    ap.add_argument("--total-examples", type=int, default=300_000, help="for the projected GPU time")
    args = ap.parse_args(argv)

    import torch

    from data_gen.sample import sample_positions, tokenize_text
    from ralm.articles import iter_articles
    from ralm.passages import build_index, write_passages
    from ralm.retrieval import BM25Retriever, query_text
    from ralm.scoring import LMScorer

    tmp = Path(tempfile.mkdtemp(prefix="datagen_bench_"))
    text, tok, text_src, tok_src = load_text_and_tokenizer(tmp)
    t = tokenize_text(tok, text, progress=False)
    L, s, k = args.max_length, args.stride, args.k
    print(f"text: {text_src}, {len(t.ids):,} tokens, {len(t.titles)} articles; tokenizer: {tok_src}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; L={L} s={s} k={k} "
          f"doc budget={args.doc_max_tokens}")

    # ---- retrieval -------------------------------------------------------------------------
    n_pass = write_passages(iter_articles(text), tmp / "jsonl", shards=1, words=100)
    build_index(tmp / "jsonl", tmp / "index", threads=1)
    retriever = BM25Retriever(str(tmp / "index"), threads=os.cpu_count())
    pos = sample_positions(len(t.ids), max(args.queries, args.examples), L, s, seed=0)
    titles = t.title_at(pos)
    queries = [query_text(tok, t.ids, int(p), args.query_tokens) for p in pos]
    retriever.search(queries[:20], k, exclude_titles=titles[:20])  # warm-up
    t0 = time.perf_counter()
    results = []
    for i in range(0, args.queries, 256):
        results += retriever.search(queries[i:i + 256][:args.queries - i], k, exclude_titles=titles[i:i + 256])
    dt = time.perf_counter() - t0
    print(f"\nretrieval (BM25 top-{k} over {n_pass:,} passages, source-article exclusion): "
          f"{args.queries} queries in {dt:.2f}s = {args.queries / dt:,.0f} queries/s")

    # ---- scoring on CPU: batched vs naive -------------------------------------------------
    model = gpt2(2, 128, 2, max(L, 1024), "cpu")
    ex = list(zip(pos[:args.examples].tolist(), results[:args.examples]))
    inputs, labels = build_rows(ex, t.ids, L, s, args.doc_max_tokens, tok)
    rows = inputs.size(0)
    scorer = LMScorer(model, batch_size=args.batch_size, dtype="float32")
    scorer.nll(inputs[:2], labels[:2], s)  # warm-up
    t0 = time.perf_counter()
    batched = -scorer.nll(inputs, labels, s).sum(1)
    t_batched = time.perf_counter() - t0
    naive_logprobs(model, inputs[:1], labels[:1], s)
    t0 = time.perf_counter()
    naive = naive_logprobs(model, inputs, labels, s)
    t_naive = time.perf_counter() - t0
    diff = (batched - naive).abs().max().item()
    print(f"\nscoring on CPU, GPT-2 2 layers x 128 wide, 50,257 vocab, random weights; {args.examples} examples "
          f"= {rows} rows of {L} tokens (max |batched - naive| = {diff:.2e})")
    for name, sec in (("naive (1 row/forward, full logits)", t_naive), ("batched LMScorer", t_batched)):
        print(f"  {name:38s} {args.examples / sec:8.2f} examples/s  {rows * L / sec:12,.0f} LM tokens/s")
    ratio = t_naive / t_batched
    print(f"  speed-up: {ratio:.1f}x  ({'ok' if ratio >= 5 else 'BELOW'} the 5x target)")

    # ---- GPT-2 small on GPU ---------------------------------------------------------------
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        n_ex = args.gpu_examples
        pos_g = sample_positions(len(t.ids), n_ex, L, s, seed=1)
        res_g = retriever.search([query_text(tok, t.ids, int(p), args.query_tokens) for p in pos_g], k,
                                 exclude_titles=t.title_at(pos_g))
        inputs, labels = build_rows(list(zip(pos_g.tolist(), res_g)), t.ids, L, s, args.doc_max_tokens, tok)
        rows = inputs.size(0)
        model = gpt2(12, 768, 12, 1024, "cuda")
        n_params = sum(p.numel() for n, p in model.named_parameters() if "wte" not in n and "wpe" not in n)
        flops_tok = 2 * n_params + 4 * 12 * L * 768  # matmuls + attention scores/values (full, not causal-halved)
        peak = bf16_peak(name)
        for bs in (64, 136, 272):
            scorer = LMScorer(model, batch_size=bs, dtype="auto")
            scorer.nll(inputs[:bs], labels[:bs], s)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            scorer.nll(inputs, labels, s)
            torch.cuda.synchronize()
            sec = time.perf_counter() - t0
            tps = rows * L / sec
            mfu = f"{100 * tps * flops_tok / (peak * 1e12):.1f}% of {peak:.0f} TFLOPS" if peak else "n/a"
            print(f"\nGPU {name}, GPT-2 small (124M) bf16, rows/forward {bs}: {n_ex / sec:,.1f} examples/s, "
                  f"{tps:,.0f} LM tokens/s, MFU {mfu}; projected {args.total_examples:,} examples: "
                  f"{args.total_examples / (n_ex / sec) / 3600:.2f} h per GPU")
    else:
        print("\n(no CUDA device: GPT-2-small GPU throughput / MFU skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
