"""``python -m data_gen.build``: the predictive reranker's training set, supervised by a frozen LM.

    python -m data_gen.build --config configs/build.yaml                       # paper settings, 300k examples
    python -m data_gen.build --config configs/build.yaml --trainer.devices 8 --trainer.strategy ddp
    python -m data_gen.build --model smollm2-135m --text.file train.txt --eval_text.file eval.txt \\
        --retrieval.index corpus/index --windows.max_length 256 --windows.doc_max_tokens 96 --examples 1000 --out data

Each example is a prefix x of the training text (the window's first L - s tokens), its next s tokens
y, the BM25 top-k passages d_1..d_k for the query made of x's last ℓ tokens (never from x's own
article nor from the forbidden evaluation articles), and log p(y | d_j ; x) for every j plus
log p(y | x). The stages (sample → retrieve → score → write shards) work in shards and resume after
a kill; BM25 for later shards runs in its own process while earlier shards are scored; re-running a
finished job checks its shards against the manifest and does nothing else. Each stage lives in its
module, and :mod:`data_gen.job` checks the inputs and runs them in turn. The result is
``OUT/*.parquet`` (schema ``ralm.schema.TRAINING_SCHEMA``; ``datasets.load_dataset("parquet",
data_files="OUT/*.parquet")``) plus ``OUT/manifest.json``.

Scoring runs through Lightning's ``Trainer.predict``: ``--trainer.devices 8 --trainer.strategy ddp``
spreads it over GPUs; several nodes: run ``--stage retrieve`` once first (shared filesystem).
"""

from __future__ import annotations

import sys

from ralm.cli import parse, run
from ralm.lock import claim
from ralm.settings import WIKITEXT103_TEST, WIKITEXT103_TRAIN, Devices, Retrieval, Scoring, Text, Windows

from .config import BuildConfig, RunConfig, Targets


def build(examples: int = 300_000, seed: int = 0, shard_size: int = 1000, model: str = "gpt2",
          text: Text = WIKITEXT103_TRAIN, eval_text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
          windows: Windows = Windows(), out: str = "checkpoints/data_gen/wt103-gpt2-dpr", stage: str = "all", batch_examples: int = 8,
          scoring: Scoring = Scoring(), num_workers: int = 0, retrieval_batch: int = 256, keep_work: bool = False,
          trainer: Devices = Devices(), verbose: bool = False, progress: bool = True,
          exclude_source: bool = True, targets: Targets = Targets(), first_shards: int | None = None) -> dict | None:
    """Build (or resume, or check) an LM-supervised reranker training set.

    Args:
        examples: Training examples (sampled prefix positions). Part of the dataset's identity, as are
            seed, shard_size, model, text, eval_text, retrieval and windows (stored in OUT/config.json).
        seed: Seed of the position sampler.
        shard_size: Examples per output parquet shard (the unit of resume).
        model: The frozen causal LM that scores (its tokenizer is used too): a short name, a directory, a
            .gguf file or a hub id.
        text: The training text (prefixes are sampled from it).
        eval_text: The evaluation text whose article titles are never retrieved (--eval_text.dataset null: none).
        retrieval: BM25 candidates: index, k, query tokens, k1, b (forbid_eval_titles: use eval_text's titles).
        windows: s (target tokens per example), L and the document budget.
        out: Output directory (shards, manifest.json, config.json, work/).
        stage: Stop after this stage: sample | retrieve | all (score and write the dataset). Several nodes:
            run --stage retrieve once first, then the same command with --stage all on every node.
        batch_examples: Examples per scoring step (each gives k+1 LM rows).
        scoring: LM rows per forward, compute dtype, and the placement of an LM larger than one device.
        num_workers: DataLoader workers building scoring batches (spawned).
        retrieval_batch: Queries per BM25 batch.
        keep_work: Keep OUT/work (token cache, retrieval results) after the dataset is complete.
        trainer: Lightning devices for the scoring stage.
        verbose: Show library and Java logging.
        progress: Show progress (a bar on a terminal, periodic lines otherwise).
        exclude_source: Never retrieve a passage titled like the example's own article (false: for a corpus
            that holds only parts of the articles the prefixes do not come from, e.g. their first halves).
        targets: Several examples per LM window (m targets, each with its own prefix) and whose BM25 list
            each scores: several times fewer LM forwards per example (1, the default: the paper's data).
        first_shards: Score and write only the first N shards, then stop (exit 0; no manifest.json): a part of the
            dataset, its first N x shard_size examples, that fits read (reranking.fit --data.examples), e.g. a
            large set scored on CPUs a part at a time. The same command with a larger N, or without it, continues.
    """
    b, r = _configs(examples, seed, shard_size, model, text, eval_text, retrieval, windows, out, stage, batch_examples,
                    scoring, num_workers, retrieval_batch, keep_work, trainer, verbose, progress, exclude_source,
                    targets, first_shards)
    from .job import build_dataset  # the LM's tokenizer, torch, Lightning: seconds that --help does without

    with claim(r.out, "--out"):  # a second build on the same --out is refused, not mixed in
        return build_dataset(b, r)


def _configs(examples, seed, shard_size, model, text, eval_text, retrieval, windows, out, stage, batch_examples,
             scoring, num_workers, retrieval_batch, keep_work, trainer, verbose, progress, exclude_source,
             targets, first_shards=None) -> tuple[BuildConfig, RunConfig]:
    """The settings checked and grouped, before anything is read or written."""
    b = BuildConfig(examples=examples, seed=seed, shard_size=shard_size, model=model, text=text, eval_text=eval_text,
                    retrieval=retrieval, windows=windows, exclude_source=exclude_source, targets=targets)
    r = RunConfig(out=out, stage=stage, batch_examples=batch_examples, scoring=scoring, num_workers=num_workers,
                  retrieval_batch=retrieval_batch, keep_work=keep_work, trainer=trainer, verbose=verbose,
                  progress=progress, first_shards=first_shards)
    trainer.kwargs(one_process=scoring.device_map is not None)  # a bad device combination fails before any work
    return b, r


def check(argv: list[str]) -> None:
    """The settings of ``python -m data_gen.build ARGV`` checked without running it (the pipeline, up front)."""
    _configs(**parse(build, argv, PROG))


PROG = "python -m data_gen.build"


def main(argv: list[str] | None = None) -> int:
    return run(build, argv, PROG, description=__doc__, after=lambda m, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
