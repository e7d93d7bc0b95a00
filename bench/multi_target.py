"""LM supervision per example with several targets per window (``data_gen.build --targets.*``), side by side.

    python -m pipeline --config configs/recipes/wikitext2-smollm2.yaml --until index   # texts and index, once
    python bench/multi_target.py                          # SmolLM2, strides 32 (the recipe's) and 4 (the paper's)
    python bench/multi_target.py --strides 32 --per-window 1 4 --examples 32

For each stride s and each way of scoring (m targets per window; candidates own or shared; rows of L or, with
extend, L + (m - 1) * s tokens), the bench runs data_gen's own sample and retrieve stages on the WikiText-2
recipe's training text and index into a temporary folder, counts the LM rows data_gen's score stage makes for
them (``data_gen.score.ChunkDataset``: a window's candidates, each passage once, and a row without one) over
``--count`` examples, and times its scoring step (``LMScoringModule.predict_step``) over the first ``--examples``.
It prints examples per second and examples per LM token (rows x tokens per row), each as a ratio to one target
per window at the same stride, all in one process. Settings: the recipe's (configs/wikitext2/build.yaml: L 256,
passages cut to 96 tokens, k 8, queries of 32 tokens); a combination whose first target would have no room for
its passage is skipped with the reason.
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


def ways(per_window: list[int]) -> list[tuple[int, str, bool]]:
    out = []
    for m in per_window:
        out += [(1, "own", False)] if m == 1 else [(m, c, e) for e in (False, True) for c in ("own", "shared")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/wikitext2", help="the recipe's output (texts/train.txt, corpus/index)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--strides", type=int, nargs="+", default=[32, 4])
    ap.add_argument("--per-window", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--examples", type=int, default=16, help="examples timed per way (a multiple of every m)")
    ap.add_argument("--count", type=int, default=256, help="examples whose LM rows are counted per way")
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args(argv)

    import torch

    from data_gen.config import BuildConfig, BuildError, RunConfig, Targets
    from pipeline.report import machine
    from data_gen.job import build_dataset, check_model
    from data_gen.score import ChunkDataset, LMScoringModule, pending_chunks
    from data_gen.shards import Layout
    from ralm.loading import load_causal_lm
    from ralm.precision import for_run
    from ralm.scoring import LMScorer
    from ralm.settings import Retrieval, Text, Windows

    run = Path(a.run)
    train, index = run / "texts" / "train.txt", run / "corpus" / "index"
    if not train.exists() or not index.exists():
        print(f"error: {train} or {index} is missing: run `python -m pipeline --config "
              "configs/recipes/wikitext2-smollm2.yaml --until index` first", file=sys.stderr)
        return 2
    precision = for_run(a.dtype, "cpu" if not torch.cuda.is_available() else "gpu")
    lm, _ = load_causal_lm(a.model, "cuda" if torch.cuda.is_available() else "cpu")
    module = LMScoringModule(lm, stride=1, batch_size=18, dtype=precision.dtype)
    module.scorer = LMScorer(lm, batch_size=18, dtype=precision.dtype)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"{machine()}, {os.cpu_count()} cores"
    print(f"# {a.model}, LM dtype {precision.dtype}, {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    print("| s | m | candidates | row tokens | LM rows / example | examples / LM token (x m=1) | "
          "examples / s (x m=1) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.strides:
            base = None
            for m, cand, extend in ways(a.per_window):
                n = max(a.count // m, 1) * m
                build = BuildConfig(examples=n, seed=0, shard_size=n, model=a.model, text=Text(file=str(train)),
                                    eval_text=Text(dataset=None), exclude_source=False,
                                    retrieval=Retrieval(index=str(index), k=8, query_tokens=32, forbid_eval_titles=False),
                                    windows=Windows(stride=s, max_length=256, doc_max_tokens=96),
                                    targets=Targets(per_window=m, candidates=cand, extend=extend))
                label = f"| {s} | {m} | {cand}{' extend' if extend else ''} |"
                try:
                    _, window = check_model(build)
                except BuildError as e:
                    print(f"{label} skipped: {str(e).split(';')[0]} |")
                    continue
                out = Path(tmp) / f"s{s}-m{m}-{cand}-{extend}"
                build_dataset(build, RunConfig(out=str(out), stage="retrieve", progress=False))
                layout = Layout(out, build)
                data = ChunkDataset(pending_chunks(layout, m), {0: str(layout.retrieved(0))}, str(layout.tokens),
                                    a.model, window, s, 96, str(layout.retrieve_failed), m)
                items = [data[i] for i in range(len(data))]  # one window each
                rows = sum(it["inputs"].size(0) for it in items)
                timed = items[:max(a.examples // m, 1)]
                module.stride, module.per_window = s, m
                t0 = time.perf_counter()
                for it in timed:
                    module.predict_step(it, 0)
                dt = time.perf_counter() - t0
                per_tok = n / (rows * window)
                per_s = len(timed) * m / dt
                base = base or (per_tok, per_s)
                print(f"{label} {window} | {rows / n:.2f} | {per_tok * 1e6:.1f} per M ({per_tok / base[0]:.2f}x) | "
                      f"{per_s:.2f} ({per_s / base[1]:.2f}x) |", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
