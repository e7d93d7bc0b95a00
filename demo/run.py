"""``python -m demo.run``: the whole pipeline, offline, on the synthetic world.

Every stage is the real command a full-scale user runs, started as its own process with the demo's
YAML from ``configs/demo/``; only the configuration differs:

1. ``python -m demo.world``        — corpus, training text and evaluation text
2. ``python -m ralm.corpus``       — 100-word titled passages → Lucene index
3. ``python -m data_gen.build``    — LM-supervised training data (the committed demo LM)
4. ``python -m reranking.fit``     — the predictive reranker (fine-tunes ``demo/assets/encoder``, a
   3-layer RoBERTa pretrained on the world by ``python -m demo.encoder``)
5. ``python -m eval.ppl`` × 6      — none / bm25 / zero-shot / encoder-only (the starting encoder
   without fine-tuning: the ablation of predictive) / predictive / oracle, then
   ``python -m eval.compare`` over them (one table, one plot)

Finished stages are reused, so a second run only prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "demo"
RERANKERS = ["none", "bm25", "zero-shot", "encoder-only", "predictive", "oracle"]
#: The ablation of the predictive row: the same starting encoder (demo/assets/encoder) used as a reranker
#: without the LM-supervised fine-tuning, so the table shows what reranking.fit adds.
PRETRAINED_ENCODER = ROOT / "demo" / "assets" / "encoder"


def stage(title: str, cmd: list[str], done: bool) -> None:
    if done:
        print(f"[demo] {title}: done already, reusing", flush=True)
        return
    print(f"[demo] {title}: {' '.join(cmd)}", flush=True)
    t = time.time()
    subprocess.run([sys.executable, *cmd], check=True, cwd=ROOT)
    print(f"[demo] {title}: finished in {time.time() - t:.0f}s", flush=True)


def yaml_flags(path: Path) -> list[str]:
    """``key: value`` lines of a YAML file as ``--key value`` flags (for CLIs without --config)."""
    import yaml

    return [x for k, v in (yaml.safe_load(path.read_text()) or {}).items() for x in (f"--{k}", str(v))]


def ordering_holds(ppl: dict[str, float]) -> bool:
    """The demo's claim, on word-level perplexity: retrieval helps, LM-aware reranking helps more."""
    return (ppl["none"] > ppl["bm25"] > ppl["predictive"] and ppl["zero-shot"] < ppl["bm25"]
            and ppl["oracle"] == min(ppl.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m demo.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="where every artifact goes (default: runs/demo)")
    ap.add_argument("--config-dir", default=str(CONFIGS),
                    help="directory with world.yaml, build.yaml, fit.yaml and ppl.yaml (default: configs/demo)")
    args = ap.parse_args(argv)
    out = (ROOT / args.out).resolve()
    configs = Path(args.config_dir).resolve()
    world, index, data = out / "world", out / "corpus", out / "data"
    reranker = out / "reranker"
    t0 = time.time()

    stage("1/5 world", ["-m", "demo.world", "--out", str(world), *yaml_flags(configs / "world.yaml")],
          (world / "eval.txt").exists())
    stage("2/5 Lucene index", ["-m", "ralm.corpus", "--text.file", str(world / "corpus.txt"), "--out", str(index)],
          (index / "index").is_dir())
    stage("3/5 training data", ["-m", "data_gen.build", "--config", str(configs / "build.yaml"),
                                "--text.file", str(world / "train.txt"), "--eval_text.file", str(world / "eval.txt"),
                                "--retrieval.index", str(index / "index"), "--out", str(data)], False)
    stage("4/5 reranker", ["-m", "reranking.fit", "--config", str(configs / "fit.yaml"),
                           "--data.data_dir", str(data),
                           "--trainer.logger.init_args.save_dir", str(out / "logs"),
                           "--export_dir", str(reranker)],
          (reranker / "reranker.json").exists())
    results = {}
    for name in RERANKERS:
        rdir = out / "ppl" / name
        stage(f"5/5 eval.ppl {name}", ["-m", "eval.ppl", "--config", str(configs / "ppl.yaml"),
                                      "--text.file", str(world / "eval.txt"), "--retrieval.index", str(index / "index"),
                                      "--reranker", {"predictive": str(reranker),
                                                     "encoder-only": str(PRETRAINED_ENCODER)}.get(name, name),
                                      "--output_dir", str(rdir), "--cache_dir", str(out / "retrieval_cache")],
              (rdir / "results.json").exists())
        results[name] = json.loads((rdir / "results.json").read_text())

    print(flush=True)
    subprocess.run([sys.executable, "-m", "eval.compare", *(str(out / "ppl" / n) for n in RERANKERS)], check=True,
                   cwd=ROOT)  # the table, plus runs/demo/ppl/comparison.{md,png}
    ppl = {name: r["ppl_word"] for name, r in results.items()}
    (out / "summary.json").write_text(json.dumps({"ppl_word": ppl, "ordering_holds": ordering_holds(ppl)}, indent=1))
    print(f"\nexpected ordering (none > bm25 > predictive, zero-shot < bm25, oracle lowest): "
          f"{'holds' if ordering_holds(ppl) else 'does NOT hold'}")
    print(f"\nTensorBoard:   .venv/bin/tensorboard --logdir {out / 'logs'}")
    print(f"summary:       {out / 'summary.json'}")
    print(f"world:         {world}\nLucene index:  {index / 'index'}\ntraining data: {data}\n"
          f"reranker:      {reranker}\nperplexities:  {out / 'ppl'}/<reranker>/results.json (+ results.md, plot.png)\n"
          f"comparison:    {out / 'ppl' / 'comparison.md'}, {out / 'ppl' / 'comparison.png'}")
    print(f"total: {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
