"""``python -m demo.run``: the whole pipeline, offline, on the synthetic world.

Every stage is the real command a full-scale user runs, with the demo's YAML from ``configs/demo/``;
only the configuration differs. Stages 1-2 run as their own processes (the index's JVM stays out of this
one); the training data, the fine-tuning and the evaluations run in this one, through the same ``main`` as
``python -m data_gen.build``, ``reranking.fit`` and ``eval.ppl`` (sparing each ~10-15 s of imports and
start-up on a 2-core CPU; the export and the tables are those of separate processes, measured):

1. ``python -m demo.world``        — corpus, training text, evaluation text and held-out text
2. ``python -m ralm.corpus``       — 100-word titled passages → Lucene index
3. ``python -m data_gen.build``    — LM-supervised training data (the committed demo LM)
4. ``python -m reranking.fit``     — the predictive reranker: the generic pretrained all-MiniLM-L6-v2
   (``minilm-l6``) fine-tuned as a bi-encoder on those LM scores alone
5. ``python -m eval.ppl`` × 12     — none / bm25 / zero-shot / cosine / predictive / oracle on the
   evaluation articles and on the held-out articles, then ``python -m eval.compare`` per text. Zero-shot
   and oracle run first: they score every candidate, and the other rows reuse those LM scores
   (``--reuse_from``; the same LM inputs), so of the others only the no-retrieval row forwards the LM.
   ``cosine`` is the same MiniLM with no fine-tuning, ranking exactly as the predictive reranker did
   before its first step: the ablation that shows what the LM supervision adds.

``--seeds '[0,1,2]'`` fine-tunes one reranker per seed (``reranker-seedN``, rows ``predictive-seedN``; the seed
is ``--seed_everything``, which the training order follows: with the demo's dropout off and no new weights
that order is the only thing a seed changes) and adds each table's mean-of-seeds row; the config's
own seed reuses the one-seed demo's reranker and rows when they exist (the same command, the same seed). Each
text also gets a table against cosine (``vs-cosine/``).

Finished stages are reused, so a second run only prints the tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "demo"
RERANKERS = ["none", "bm25", "zero-shot", "cosine", "predictive", "oracle"]
#: The rows :func:`ordering_holds` compares (zero-shot is reported beside them, not part of the claim).
CLAIM = ["none", "bm25", "cosine", "predictive", "oracle"]
#: Rows that score every candidate with the LM to choose; they run first and the other rows of the same text
#: take their target NLLs from them instead of forwarding the LM again (``eval.ppl --reuse_from``).
LENDERS = ["zero-shot", "oracle"]
#: Texts the rerankers are evaluated on (files of the world directory). No setting was chosen on
#: the held-out articles; the zero-shot s′ was chosen on dev.txt (see configs/demo/ppl.yaml).
TEXTS = ["eval", "heldout"]


def stage(title: str, cmd: list[str], done: bool, in_process: bool = False) -> None:
    """Run ``python -m MODULE ARGS`` (``cmd``), or with ``in_process`` call that module's ``main(ARGS)`` here."""
    if done:
        print(f"[demo] {title}: done already, reusing", flush=True)
        return
    print(f"[demo] {title}: {' '.join(cmd)}", flush=True)
    t = time.time()
    if in_process:
        from ralm.cli import run_module

        assert cmd[0] == "-m", cmd
        rc = run_module(cmd[1], cmd[2:], cwd=ROOT)  # as the subprocess's cwd: configs name paths from the root
        if rc:
            raise subprocess.CalledProcessError(rc, ["python", *cmd])
    else:
        subprocess.run([sys.executable, *cmd], check=True, cwd=ROOT)
    print(f"[demo] {title}: finished in {time.time() - t:.0f}s", flush=True)


def cosine_flags(fit_yaml: Path) -> list[str]:
    """``eval.ppl`` flags that make the cosine row the untrained version of the fitted bi-encoder:
    the same encoder, prefix length and passage length (read from the fit's own settings)."""
    import yaml

    m = yaml.safe_load(fit_yaml.read_text())["model"]
    return ["--ranker.model", str(m["encoder"]), "--ranker.input.max_prefix_tokens", str(m["input"]["max_prefix_tokens"]),
            "--ranker.input.max_passage_tokens", str(m["input"]["max_passage_tokens"])]


def seed_names(seeds: list[int], config_seed: int) -> dict[int, tuple[str, str]]:
    """Each seed's reranker directory and evaluation row: ``reranker`` / ``predictive`` for the config's own seed
    alone (the one-seed demo), ``reranker-seedN`` / ``predictive-seedN`` otherwise (eval.compare's seed groups)."""
    if len(set(seeds)) != len(seeds) or not seeds:
        from ralm.settings import SettingsError

        raise SettingsError(f"--seeds {seeds}: give one or more distinct integers, e.g. '[0,1,2]'")
    if seeds == [config_seed]:
        return {config_seed: ("reranker", "predictive")}
    return {s: (f"reranker-seed{s}", f"predictive-seed{s}") for s in seeds}


def reuse_config_seed(out: Path, texts: list[str], names: dict[int, tuple[str, str]], config_seed: int) -> None:
    """Link the one-seed demo's reranker and rows under the config seed's ``-seedN`` names, so that
    ``--seeds`` after a plain demo run fine-tunes and evaluates only the other seeds."""
    if config_seed not in names or names[config_seed][0] == "reranker":
        return
    pairs = [(out / "reranker", out / names[config_seed][0])]
    pairs += [(out / "ppl" / t / "predictive", out / "ppl" / t / names[config_seed][1]) for t in texts]
    if (out / "reranker" / "reranker.json").exists():
        for src, dst in pairs:
            if src.exists() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to(src.name, target_is_directory=True)
                print(f"[demo] seed {config_seed}: reusing {src} as {dst.name}", flush=True)


def ordering_holds(ppl: dict[str, float]) -> bool:
    """The demo's claim, on word-level perplexity: retrieval helps, the LM-supervised reranker helps
    more and beats the same encoder without LM supervision, the oracle bounds them all. (Zero-shot is
    reported beside them; its s′ was chosen on dev.txt and it is not part of the claim.)"""
    return (ppl["none"] > ppl["bm25"] > ppl["predictive"] and ppl["predictive"] < ppl["cosine"]
            and ppl["oracle"] == min(ppl.values()))


def demo(out: str = "runs/demo", config_dir: str = str(CONFIGS),
         precision: Literal["auto", "float32", "bfloat16"] = "auto", rerankers: list[str] = RERANKERS,
         seeds: list[int] | None = None) -> int:
    """Run every stage (finished ones are reused) and print the tables.

    Args:
        out: Where every artifact goes.
        config_dir: Directory with world.yaml, build.yaml, fit.yaml and ppl.yaml.
        precision: Compute precision of every stage (auto: bf16 where the CPU runs it natively, float32
            elsewhere; ralm.precision). A different precision needs a fresh --out (finished stages are reused).
        rerankers: The rows to evaluate, of none, bm25, zero-shot, cosine, predictive, oracle; every row
            of the claim (all but zero-shot) is required, e.g. '[none,bm25,cosine,predictive,oracle]'.
        seeds: Fine-tuning seeds (default: fit.yaml's seed_everything alone). Several give one reranker and
            one predictive row per seed and the tables' mean-of-seeds row; the ordering is checked on that mean.
    """
    import yaml

    from ralm.settings import SettingsError

    unknown = [r for r in rerankers if r not in RERANKERS]
    missing = [r for r in CLAIM if r not in rerankers]
    if unknown or missing:
        raise SettingsError(f"--rerankers {','.join(rerankers)}: "
                            + (f"unknown {', '.join(unknown)} (choose from {', '.join(RERANKERS)})" if unknown
                               else f"the ordering check needs {', '.join(missing)} too"))
    rerankers = [r for r in RERANKERS if r in rerankers]
    scoring = ["--scoring.dtype", precision]
    fit_precision = ["--trainer.precision", {"auto": "auto", "float32": "32-true", "bfloat16": "bf16-mixed"}[precision]]
    out = (ROOT / out).resolve()
    configs = Path(config_dir).resolve()
    world, index, data = out / "world", out / "corpus", out / "data"
    config_seed = int(yaml.safe_load((configs / "fit.yaml").read_text()).get("seed_everything", 0))
    names = seed_names(list(seeds) if seeds is not None else [config_seed], config_seed)
    t0 = time.time()

    stage("1/5 world", ["-m", "demo.world", "--config", str(configs / "world.yaml"), "--out", str(world)],
          False)  # one second, and the same files every time (a pure function of world.yaml)
    texts = [t for t in TEXTS if (world / f"{t}.txt").exists()]  # heldout-articles: 0 -> eval only
    stage("2/5 Lucene index", ["-m", "ralm.corpus", "--text.file", str(world / "corpus.txt"), "--out", str(index)],
          (index / "index").is_dir())
    stage("3/5 training data", ["-m", "data_gen.build", "--config", str(configs / "build.yaml"),
                                "--text.file", str(world / "train.txt"), "--eval_text.file", str(world / "eval.txt"),
                                "--retrieval.index", str(index / "index"), "--out", str(data), *scoring], False,
          in_process=True)
    reuse_config_seed(out, texts, names, config_seed)
    for seed, (rdir_name, _) in names.items():
        version = [] if rdir_name == "reranker" else ["--trainer.logger.init_args.version", f"seed{seed}"]
        stage(f"4/5 reranker (seed {seed})", ["-m", "reranking.fit", "--config", str(configs / "fit.yaml"),
                                              "--seed_everything", str(seed),
                                              "--data.data_dir", str(data),
                                              "--trainer.logger.init_args.save_dir", str(out / "logs"), *version,
                                              "--export_dir", str(out / rdir_name), *fit_precision],
              (out / rdir_name / "reranker.json").exists(), in_process=True)
    extra = {row: ["--reranker", str(out / rdir_name)] for rdir_name, row in names.values()}
    extra["cosine"] = ["--reranker", "cosine", *cosine_flags(configs / "fit.yaml")]
    rows = [r for name in rerankers for r in ([row for _, row in names.values()] if name == "predictive" else [name])]
    ppl: dict[str, dict[str, float]] = {}
    for text in texts:
        lenders: list[str] = []  # zero-shot and oracle score every candidate; the later rows reuse those scores
        for name in sorted(rows, key=lambda r: r not in LENDERS):
            rdir = out / "ppl" / text / name
            reuse = ["--reuse_from", "[" + ",".join(lenders) + "]"] if lenders and name not in ("zero-shot", "none") else []
            stage(f"5/5 eval.ppl {text} {name}",
                  ["-m", "eval.ppl", "--config", str(configs / "ppl.yaml"), "--text.file", str(world / f"{text}.txt"),
                   "--retrieval.index", str(index / "index"), *extra.get(name, ["--reranker", name]),
                   "--output_dir", str(rdir), "--cache_dir", str(out / "retrieval_cache"), *reuse, *scoring],
                  (rdir / "results.json").exists(), in_process=True)
            if name in LENDERS:
                lenders.append(str(rdir))
            ppl.setdefault(text, {})[name] = json.loads((rdir / "results.json").read_text())["ppl_word"]
        if "predictive" not in ppl[text]:  # several seeds: the claim is checked on their mean, as the table has it
            from eval.compare import mean_of_seeds

            ppl[text]["predictive"] = mean_of_seeds([ppl[text][row] for _, row in names.values()])

    from eval.compare import main as compare  # the table, plus runs/demo/ppl/<text>/comparison.{md,png}

    for text in texts:
        runs = [str(out / "ppl" / text / n) for n in rows]
        for title, args in ((f"{text} articles ({world / f'{text}.txt'})", runs),
                            (f"{text} articles against the untrained encoder (cosine)",
                             [*runs, "--baseline", "cosine", "--out", str(out / "ppl" / text / "vs-cosine")])):
            print(f"\n{title}:", flush=True)
            if compare(args):
                raise subprocess.CalledProcessError(2, "eval.compare")
    holds = {text: ordering_holds(p) for text, p in ppl.items()}
    (out / "summary.json").write_text(json.dumps({"ppl_word": ppl, "ordering_holds": holds}, indent=1))
    print("\nexpected ordering (none > bm25 > predictive, predictive < cosine, oracle lowest): "
          + ", ".join(f"{text} {'holds' if h else 'does NOT hold'}" for text, h in holds.items()))
    print(f"\nTensorBoard:   .venv/bin/tensorboard --logdir {out / 'logs'}")
    print(f"summary:       {out / 'summary.json'}")
    print(f"world:         {world}\nLucene index:  {index / 'index'}\ntraining data: {data}\n"
          f"reranker:      {', '.join(str(out / d) for d, _ in names.values())}\nperplexities:  {out / 'ppl'}/<text>/<reranker>/results.json (+ results.md, plot.png)\n"
          f"comparison:    {out / 'ppl'}/<text>/comparison.md, comparison.png; against cosine: vs-cosine/")
    print(f"total: {time.time() - t0:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(demo, argv, "python -m demo.run", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
