"""The paper's whole pipeline on real text with real models, sized for a 2-core CPU, stage by stage.

    python bench/real_reranker.py prepare     # splits and the related, leak-free BM25 index (~1 min)
    python bench/real_reranker.py data        # data_gen.build with SmolLM2 (hours; committed under data/real/)
    python bench/real_reranker.py fit         # MiniLM rerankers (configs/real/fit_ARCH.yaml), several seeds
    python bench/real_reranker.py validate    # every reranker on the fits' held-out training examples (minutes)
    python bench/real_reranker.py heldout     # every reranker on the shards no fit read (minutes)
    python bench/real_reranker.py eval        # eval.ppl rows on the report text, then eval.compare
    python bench/real_reranker.py all         # every stage in turn

Splits (docs/METHOD.md §5). For every WikiText-2 article of train, valid and test, its first half is
indexed (``ralm.corpus.article_halves``); training prefixes come from the second halves of the *train*
articles; settings are chosen on the second halves of the first 20 *valid* articles (``dev``); results
are reported on the second halves of the first 20 *test* articles (``report``) and re-checked on the
second halves of test articles 21-40 (``recheck``), which nothing was chosen on. No passage overlaps
an evaluated text; the related text (the same article's first half) is in the corpus, as it is for a
corpus that covers the evaluated topics.

Every stage is a real command (``ralm.corpus``, ``data_gen.build``, ``reranking.fit``, ``eval.ppl``,
``eval.compare``) run as a subprocess with a config under ``configs/real/``; each one resumes after a
kill, so a rerun of this script continues where it stopped. Needs ``../shared/data`` (WikiText-2) and
``python -m ralm.models fetch smollm2-135m minilm-l6``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SOURCES = {"train": SHARED / "wikitext-2-tokens" / "wiki.train.tokens",
           "valid": SHARED / "wikitext-2-raw" / "wiki.valid.raw",
           "test": SHARED / "wikitext-2-raw" / "wiki.test.raw"}
#: (name, source split, first article, last article + 1) of the texts the LM reads.
TEXTS = (("train", "train", 0, None), ("dev", "valid", 0, 20), ("report", "test", 0, 20),
         ("recheck", "test", 20, 40))


#: report-slice.txt: the report text up to the first paragraph end after this many characters (53 strides),
#: where every row, zero-shot and oracle included, is cheap enough to time side by side.
SLICE_CHARS = 8000


def run(cmd: list[str], log: Path | None = None) -> None:
    print("$ " + " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run([sys.executable, *cmd], check=True, cwd=ROOT)
    print(f"  ({time.time() - t:.0f} s)", flush=True)


def prepare(out: Path) -> None:
    """Write the corpus text (first halves of every article), the four read texts and the report text's
    slice, and index the corpus."""
    sys.path.insert(0, str(ROOT))
    from ralm.corpus import article_halves

    texts = out / "texts"
    texts.mkdir(parents=True, exist_ok=True)
    halves = {split: article_halves(path.read_text(encoding="utf-8")) for split, path in SOURCES.items()}
    corpus = "".join(first for split in ("train", "valid", "test") for _, first, _ in halves[split])
    (texts / "corpus.txt").write_text(corpus, encoding="utf-8")
    for name, split, lo, hi in TEXTS:
        part = halves[split][lo:hi]
        (texts / f"{name}.txt").write_text("".join(second for _, _, second in part), encoding="utf-8")
        print(f"{name}: {len(part)} {split} articles, second halves", flush=True)
    report = (texts / "report.txt").read_text(encoding="utf-8")
    (texts / "report-slice.txt").write_text(report[:report.index("\n \n", SLICE_CHARS) + 3], encoding="utf-8")
    if not (out / "corpus" / "index").is_dir():
        run(["-m", "ralm.corpus", "--text.file", str(texts / "corpus.txt"), "--out", str(out / "corpus")])


def data(out: Path, extra: list[str]) -> None:
    run(["-m", "data_gen.build", "--config", "configs/real/build.yaml", "--text.file", str(out / "texts" / "train.txt"),
         "--retrieval.index", str(out / "corpus" / "index"), *extra])


DATA = ROOT / "data" / "real" / "smollm2-wt2"


def training_data(out: Path, shards: int | None, heldout: int = 0) -> Path:
    """The training shards a fit reads: the first ``shards`` shards of the committed dataset (all when
    None), linked into one directory so that the fit's data is fixed even while data_gen still runs.
    ``heldout`` > 0: instead the ``heldout`` shards right after the first ``shards`` (examples no such fit
    read; a fixed count, so that a table stays the same when data_gen adds shards)."""
    files = sorted(DATA.glob("train-*.parquet"))
    if shards is not None:
        want = [f for f in files if int(f.name.split("-")[1]) < shards]
        if len(want) < shards:
            raise SystemExit(f"--shards {shards}: only {len(want)} of the first {shards} shards are in {DATA}; "
                             "run the data stage further or lower --shards")
        if heldout:
            files = [f for f in files if shards <= int(f.name.split("-")[1]) < shards + heldout]
            if len(files) < heldout:
                raise SystemExit(f"--heldout-shards {heldout}: only {len(files)} shard(s) after the first {shards} "
                                 f"are in {DATA}; run the data stage further or lower --heldout-shards")
        else:
            files = want
    if heldout and shards is None:
        raise SystemExit("held-out shards need the fits' --shards (the shards after them are the held-out ones)")
    ids = [int(f.name.split("-")[1]) for f in files]
    d = out / ((f"heldout-data-shard{ids[0]}" if len(ids) == 1 else f"heldout-data-shards{ids[0]}-{ids[-1]}")
               if heldout else f"train-data-{len(files)}shards")
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        link = d / f.name
        if not link.exists():
            link.symlink_to(f)
    return d


def fit_config(arch: str) -> dict:
    """``configs/real/fit_ARCH.yaml``, parsed."""
    import yaml

    return yaml.safe_load((ROOT / "configs" / "real" / f"fit_{arch}.yaml").read_text())


#: Fit settings that change how a model is trained, not the model it starts from.
TRAINING_ONLY = ("loss", "temperature", "lr", "weight_decay", "warmup_steps", "total_steps", "passage_grad",
                 "attention_dropout")


def export_untrained(out: Path, arch: str) -> None:
    """A bi-encoder with a BM25 prior before any training (``ARCH-untrained``): the ablation row that says
    what training adds to the prior. (A plain bi-encoder's untrained row is the cosine row; a cross-
    encoder's untrained head is random, so its start is exported per seed: :func:`cross_with_prior`.)"""
    def settings(name: str) -> dict:
        return fit_config(name)["model"]

    def start(model: dict) -> dict:  # the settings that make the untrained model
        return {k: v for k, v in model.items() if k not in TRAINING_ONLY}

    model = settings(arch)
    target = out / "rerankers" / f"{arch}-untrained"
    if (model.get("architecture") != "bi" or not model.get("bm25_weight") or (target / "reranker.json").exists()
            or (arch != "bi_bm25" and start(model) == start(settings("bi_bm25")))):  # a lever on bi_bm25's start
        return
    from reranking.export import export
    from reranking.system import RerankerSystem

    export(RerankerSystem(**model), target, trained={"steps": 0})
    print(f"{target}: the untrained {arch} reranker", flush=True)


def fit(out: Path, archs: list[str], seeds: list[int], shards: int | None, extra: list[str], dev: bool = False) -> None:
    """Fit each config and seed; ``dev``: a lever being judged, exported under ``rerankers-dev/`` where the
    eval stage does not look (it reads ``rerankers/``), so that nothing unchosen reaches an evaluated text."""
    data_dir = training_data(out, shards)
    for arch in archs:
        if not dev:
            export_untrained(out, arch)
        for seed in seeds:
            export = out / ("rerankers-dev" if dev else "rerankers") / f"{arch}-seed{seed}"
            runs = [(export, f"seed{seed}", [])]
            if cross_with_prior(arch):  # its start: the same seeded construction, zero steps
                runs.append((export.with_name(f"{export.name}-untrained"), f"seed{seed}-start",
                             ["--trainer.max_steps", "0", "--model.total_steps", "100"]))
            for target, version, steps in runs:
                if (target / "reranker.json").exists():
                    print(f"{target}: done already", flush=True)
                    continue
                run(["-m", "reranking.fit", "--config", f"configs/real/fit_{arch}.yaml", "--data.data_dir",
                     str(data_dir), "--seed_everything", str(seed), "--trainer.logger.init_args.save_dir",
                     str(out / "logs"), "--trainer.logger.init_args.version", version, "--export_dir", str(target),
                     *steps, *extra])


def cross_with_prior(arch: str) -> bool:
    """A cross-encoder with a BM25 prior: its untrained head is random (seeded), so its ablation row is the
    seed's own start, ``ARCH-seedS-untrained``, exported by ``reranking.fit`` with zero steps."""
    model = fit_config(arch)["model"]
    return model.get("architecture") == "cross" and bool(model.get("bm25_weight"))


def exports(out: Path) -> list[Path]:
    """Every finished export: the evaluated ones (``rerankers/``), then the levers (``rerankers-dev/``)."""
    return [p for d in ("rerankers", "rerankers-dev") for p in sorted((out / d).glob("*-*")) if (p / "reranker.json").exists()]


def validate(out: Path, shards: int | None) -> None:
    """Every reranker found (and the untrained cosine) on the held-out training examples the fits validate
    on (``val_fraction`` of train-article examples, split by id): the same metrics as the fits' validation
    (``RerankerSystem.validation_step``), one table. Cheap (no LM forwards: the targets are stored), so it
    is where levers are compared before any evaluated text is read."""
    import lightning.pytorch as pl
    from safetensors.torch import load_model

    from ralm.cli import quiet_lightning
    from ralm.precision import lightning_precision
    from reranking.data import RerankDataModule
    from reranking.system import RerankerSystem

    quiet_lightning(False)
    data_dir = training_data(out, shards)
    rows = [("cosine", "bi", None)] + [(p.name, p.name.split("-")[0], p) for p in exports(out)]
    keys = ["nll_reranker", "gap_captured", "mrr", "top1_agreement", "nll_bm25", "nll_oracle", "nll_nodoc"]
    lines = ["| reranker | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, arch, export in rows:
        cfg = fit_config(arch)
        model, d = cfg["model"], cfg["data"]
        pl.seed_everything(0, verbose=False)
        system = RerankerSystem(**model)
        if export is not None:
            load_model(system.model, str(export / "model.safetensors"), strict=True)
        dm = RerankDataModule(data_dir=str(data_dir), tokenizer=model["encoder"], val_fraction=d["val_fraction"],
                              batch_size=d["batch_size"], val_batch_size=d["val_batch_size"],
                              max_candidates=d["max_candidates"], num_workers=0,
                              **{k: model[k] for k in ("max_length", "max_prefix_tokens", "architecture",
                                                       "max_passage_tokens") if k in model})
        precision, _ = lightning_precision(cfg["trainer"].get("precision", "auto"), "cpu")  # as the fit ran
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, precision=precision)
        got = trainer.validate(system, datamodule=dm, verbose=False)[0]
        lines.append(f"| {name} | " + " | ".join(f"{got['val/' + k]:.4f}" for k in keys) + " |")
        print(lines[-1], flush=True)
    n = int(got["val/examples"])
    text = f"{n} held-out training examples ({data_dir.name})\n\n" + "\n".join(lines) + "\n"
    (out / "validation.md").write_text(text)
    print(text, flush=True)


def heldout(out: Path, shards: int | None, n_heldout: int = 1) -> None:
    """Every reranker found, the untrained cosine and BM25's first as choosers on the ``n_heldout`` shards
    after the fits' first ``shards`` (``bench/heldout.py``): hundreds of examples no fit read, where the
    fits' own validation split has 78. Encoder passes only, so this is where levers are compared."""
    from bench.heldout import main as heldout_main

    data_dir = training_data(out, shards if shards is not None else 3, heldout=n_heldout)
    found = [str(p) for p in exports(out)]
    against = ",".join(["cosine"] + [Path(p).name for p in found if p.endswith("-untrained")])
    heldout_main(["--data", str(data_dir), "--rerankers", *found, "--cosine", str(ROOT / "configs" / "real" / "fit_bi.yaml"),
                  "--against", against, "--out", str(out / "heldout.md")])


CHEAP = ["none", "bm25", "cosine"]   # one LM row per stride
COSTLY = ["zero-shot", "oracle"]      # k LM rows per stride


def trained_rows(out: Path) -> list[tuple[str, list[str]]]:
    found = sorted(p for p in (out / "rerankers").glob("*-*") if (p / "reranker.json").exists())
    return [(p.name, ["--reranker", str(p)]) for p in found]


def eval_run(out: Path, text: str, name: str, flags: list[str], extra: list[str]) -> str:
    d = out / "ppl" / text / name
    if not (d / "results.json").exists():
        run(["-m", "eval.ppl", "--config", "configs/real/ppl.yaml", "--text.file", str(out / "texts" / f"{text}.txt"),
             "--retrieval.index", str(out / "corpus" / "index"), *flags, "--output_dir", str(d),
             "--cache_dir", str(out / "ppl" / text / "retrieval_cache"), *extra])
    return str(d)


def evaluate(out: Path, texts: list[str], cheap_texts: list[str], extra: list[str], reuse: bool = True) -> None:
    """The one-row-per-stride runs on every text first (baselines, then every trained reranker found), then
    zero-shot and oracle (k rows per stride) on the texts not in ``cheap_texts``; then the comparisons.
    With ``reuse``, the cosine and trained rows take the bm25 row's LM scores on the strides where they
    choose BM25's passage (``eval.ppl --reuse_from``: the same numbers, fewer forwards, no cost figure)."""
    from demo.run import cosine_flags  # the cosine row: fit_bi.yaml's encoder and lengths, untrained

    flags = {"cosine": ["--reranker", "cosine", *cosine_flags(ROOT / "configs" / "real" / "fit_bi.yaml")]}
    rows = [(r, flags.get(r, ["--reranker", r])) for r in CHEAP] + trained_rows(out)

    def row(text: str, name: str, row_flags: list[str]) -> str:
        lend = reuse and name not in ("none", "bm25")
        return eval_run(out, text, name, row_flags + (["--reuse_from", str(out / "ppl" / text / "bm25")] if lend
                                                      else []), extra)

    runs = {text: [row(text, name, f) for name, f in rows] for text in texts}
    for text in texts:
        if text not in cheap_texts:
            runs[text][3:3] = [eval_run(out, text, r, ["--reranker", r], extra) for r in COSTLY]
    for text in texts:
        untrained = [Path(r).name for r in runs[text] if Path(r).name.endswith("-untrained")]
        for baseline in ("bm25", "cosine", *untrained):  # an untrained prior: what training adds to it
            run(["-m", "eval.compare", *runs[text], "--baseline", baseline, "--out", str(out / "ppl" / text / f"vs-{baseline}")])
        print(f"\n## {text}\n" + (out / "ppl" / text / "vs-bm25" / "comparison.md").read_text()
              + "\n" + seeds_summary(out / "ppl" / text), flush=True)


def seeds_summary(ppl_dir: Path) -> str:
    """Mean and spread over training seeds of each trained architecture's word perplexity."""
    import json
    import statistics

    by: dict[str, list[float]] = {}
    for r in sorted(ppl_dir.glob("*-seed*/results.json")):
        by.setdefault(r.parent.name.split("-seed")[0], []).append(json.loads(r.read_text())["ppl_word"])
    lines = ["| reranker | seeds | word ppl per seed | mean | sd |", "|---|---|---|---|---|"]
    for arch, v in by.items():
        sd = statistics.stdev(v) if len(v) > 1 else float("nan")
        lines.append(f"| {arch} | {len(v)} | {', '.join(f'{x:.3f}' for x in v)} | {statistics.mean(v):.3f} | {sd:.3f} |")
    text = "\n".join(lines) + "\n"
    (ppl_dir / "seeds.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["prepare", "data", "fit", "validate", "heldout", "eval", "all"])
    ap.add_argument("--out", default="runs/real", help="where splits, index, runs and tables go")
    ap.add_argument("--archs", default="bi,bi_bm25", help="rerankers to fit (configs/real/fit_ARCH.yaml: bi, bi_bm25, cross)")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds")
    ap.add_argument("--shards", type=int, default=None,
                    help="fit on the first N shards of data/real/smollm2-wt2 (default: all that are there)")
    ap.add_argument("--heldout-shards", type=int, default=1,
                    help="heldout: judge on this many shards after the fits' --shards (default 1: shard 3 for "
                         "--shards 3, the README's tables)")
    ap.add_argument("--dev", action="store_true",
                    help="fit: export under rerankers-dev/ (a lever judged on held-out shards, never evaluated)")
    ap.add_argument("--texts", default="report,recheck", help="texts to evaluate on (runs/real/texts/NAME.txt)")
    ap.add_argument("--cheap-texts", default="recheck",
                    help="texts evaluated without the k-forward rows (zero-shot, oracle)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="score every stride of every row (for the cost column) instead of taking the bm25 "
                         "row's LM scores where a row chose BM25's passage")
    a, extra = ap.parse_known_args(argv)  # anything else is passed to the stage's command
    if not SOURCES["test"].is_file():
        print(f"needs {SHARED} (WikiText-2)", file=sys.stderr)
        return 2
    out = (ROOT / a.out).resolve()
    sys.path.insert(0, str(ROOT))
    if a.stage in ("prepare", "all") or not (out / "corpus" / "index").is_dir():
        prepare(out)
    if a.stage in ("data", "all"):
        data(out, extra)
    if a.stage in ("fit", "all"):
        fit(out, a.archs.split(","), [int(s) for s in a.seeds.split(",")], a.shards, extra, dev=a.dev)
    if a.stage in ("validate", "all"):
        validate(out, a.shards)
    if a.stage in ("heldout", "all"):
        heldout(out, a.shards, a.heldout_shards)
    if a.stage in ("eval", "all"):
        evaluate(out, a.texts.split(","), a.cheap_texts.split(","), extra, reuse=not a.no_reuse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
