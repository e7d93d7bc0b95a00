"""How good a chooser the *untrained* bi_bm25 reranker is on the training targets, for BM25 prior weights.

    python bench/prior_sweep.py --data runs/real/train-data-3shards --weights 0,0.25,0.5,1,2,4,1000

Every stored training example (``data_gen.build``'s log p(y | d; x) of each of its k candidates) scored by
the untrained pretrained encoder of ``configs/real/fit_bi_bm25.yaml`` (cosine / τ) once, then for each
weight w the candidate with the highest cosine / τ + w × BM25 is "chosen"; printed: the mean −log p(y | d; x)
of the choice (nats per 32-token target, lower is better), the share where it is BM25's first, and a paired
bootstrap interval of its difference from BM25's first. No training is involved, so every example is
held out for this; nothing evaluated is read. It answers whether the prior the fits start from is a
better chooser than BM25 on the LM's own targets, with ~20x the examples of the fits' validation split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def score_all(data_dir: str, config: Path) -> dict[str, np.ndarray]:
    """Cosine / τ, BM25 and the LM's log-probabilities ``[n, k]`` (padding: -inf / 0 / -inf)."""
    import yaml

    from reranking.data import RerankDataModule
    from reranking.system import RerankerSystem

    cfg = yaml.safe_load(config.read_text())
    model = {**cfg["model"], "bm25_weight": 0.0}  # the encoder's part alone; BM25 is added below
    torch.manual_seed(0)
    system = RerankerSystem(**model).eval()
    dm = RerankDataModule(data_dir=data_dir, tokenizer=model["encoder"], val_fraction=0.999, batch_size=16,
                          val_batch_size=32, max_candidates=cfg["data"]["max_candidates"], num_workers=0,
                          **{k: model[k] for k in ("max_length", "max_prefix_tokens", "architecture", "max_passage_tokens")
                             if k in model})
    dm.setup("validate")
    parts: dict[str, list] = {"cos": [], "bm25": [], "lm": []}
    with torch.inference_mode():
        for i, batch in enumerate(dm.val_dataloader()):
            mask = batch["mask"]
            parts["cos"].append(system.score_batch(batch).numpy())
            parts["bm25"].append(batch["bm25"].numpy())
            parts["lm"].append(batch["lm_logprobs"].float().masked_fill(~mask, float("-inf")).numpy())
            print(f"\r{(i + 1) * 32} examples scored", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {k: np.concatenate(v) for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/real/train-data-3shards", help="data_gen.build shards")
    ap.add_argument("--config", default=str(ROOT / "configs" / "real" / "fit_bi_bm25.yaml"))
    ap.add_argument("--weights", default="0,0.25,0.5,1,2,4,1000", help="BM25 prior weights (1000: BM25 alone)")
    ap.add_argument("--resamples", type=int, default=1000)
    a = ap.parse_args(argv)
    s = score_all(a.data, Path(a.config))
    lm, n = s["lm"], len(s["lm"])
    nll_bm25 = -lm[:, 0]
    rng = np.random.default_rng(0)
    boot = rng.integers(n, size=(a.resamples, n))
    print(f"{n} examples, k <= {lm.shape[1]}; oracle {-lm.max(1).mean():.3f}, BM25's first {nll_bm25.mean():.3f}\n")
    print("| BM25 weight | mean -log p(y given chosen d) | chosen = BM25's first | vs BM25's first [95% CI] |")
    print("|---|---|---|---|")
    for w in (float(x) for x in a.weights.split(",")):
        pick = (s["cos"] + w * s["bm25"]).argmax(1)
        nll = -lm[np.arange(n), pick]
        d = nll - nll_bm25
        lo, hi = np.percentile(d[boot].mean(1), [2.5, 97.5])
        print(f"| {w:g} | {nll.mean():.3f} | {(pick == 0).mean():.1%} | {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
