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
module (``sample.run_sample``, ``retrieve.start_retrieve``, ``score.run_score``, ``shards.assemble_shard``
and ``shards.write_manifest``); this one checks the inputs and runs them in turn. The result is
``OUT/*.parquet`` (schema ``ralm.schema.TRAINING_SCHEMA``; ``datasets.load_dataset("parquet",
data_files="OUT/*.parquet")``) plus ``OUT/manifest.json``.

Scoring runs through Lightning's ``Trainer.predict``: ``--trainer.devices 8 --trainer.strategy ddp``
spreads it over GPUs; several nodes: run ``--stage retrieve`` once first (shared filesystem).
"""

from __future__ import annotations

import json
import sys
import time

from ralm.settings import (
    WIKITEXT103_TEST,
    WIKITEXT103_TRAIN,
    Devices,
    Retrieval,
    Scoring,
    Text,
    Windows,
)

from .config import BuildConfig, BuildError, RunConfig, load_text, log


# ---------------------------------------------------------------------------------------------
# inputs, checked before anything is written


def check_model(build: BuildConfig):
    """The LM's tokenizer and its effective window L, after the causal-LM and vocabulary checks."""
    from ralm.models import ModelError, check_causal_lm, load_config, load_tokenizer
    from ralm.scoring import context_length

    try:
        tok, cfg = load_tokenizer(build.model), load_config(build.model)
        check_causal_lm(build.model, cfg, tok)
    except ModelError as e:
        raise BuildError(str(e) if "--model" in str(e) else f"--model: {e}") from None
    window = build.windows.fitted(context_length(cfg))
    build.retrieval.check_windows(build.windows, window)
    return tok, window


def forbidden_from_eval(build: BuildConfig) -> set[str]:
    from ralm.corpus import forbidden_titles

    if not (build.retrieval.forbid_eval_titles and build.eval_text.given):
        return set()
    titles = forbidden_titles(load_text(build.eval_text, "eval_text"))
    if not titles:
        raise BuildError("the evaluation text has no ` = Title = ` headings, so no title can be forbidden; pass a "
                         "WikiText-layout --eval_text.file, or --eval_text.dataset null to forbid nothing")
    return titles


# ---------------------------------------------------------------------------------------------
# the job


def build_dataset(build: BuildConfig, run: RunConfig) -> dict | None:
    """Run (or resume) the whole job; returns the manifest when the dataset is complete."""
    from ralm.cli import quiet_libraries
    from ralm.lock import global_rank

    from .retrieve import start_retrieve
    from .sample import run_sample
    from .score import run_score
    from .shards import Layout, assemble_shard, check_config, write_manifest

    quiet_libraries(run.verbose)
    layout = Layout(run.out, build)
    rank0 = global_rank() == 0
    check_config(layout)
    if layout.manifest.exists():
        return _already_complete(layout, rank0)
    tokenizer, window, forbidden = _check_inputs(layout, build)
    if rank0:
        _clean_after_kill(layout)
    tokens, samples = run_sample(layout, build, tokenizer, window, write=rank0)
    if run.stage == "sample":
        return None
    thread = start_retrieve(layout, run, tokens, samples, forbidden, rank0)
    if run.stage == "retrieve":
        return None
    if rank0:  # shards completed by a killed run (all chunks scored, shard not yet written)
        for s in range(build.n_shards):
            if not layout.shard(s).exists() and layout.scores(s).is_dir():
                assemble_shard(layout, s, tokens, tokenizer, window)

    def shard_done(s: int) -> None:  # a finished shard becomes final while later ones are scored
        if assemble_shard(layout, s, tokens, tokenizer, window):
            log(f"[score] shard {s} written: {layout.shard(s).name}")

    writer = run_score(layout, run, window, rank0, build.examples, shard_done)
    if thread is not None:
        thread.join()
        if thread.error is not None:
            raise thread.error
    if not writer:
        return None
    for s in range(build.n_shards):
        if not assemble_shard(layout, s, tokens, tokenizer, window):
            raise BuildError(f"shard {s} has unscored examples after scoring; rerun the same command")
    return write_manifest(layout, run, window, tokenizer, len(tokens))


def _already_complete(layout, rank0: bool) -> dict:
    """A finished job: check every shard against its manifest and return the manifest."""
    from .shards import verify_manifest

    manifest = json.loads(layout.manifest.read_text())
    verify_manifest(layout, manifest)
    if rank0:
        log(f"already complete: {manifest['examples']:,} examples in {len(manifest['shards'])} shard(s) under "
             f"{layout.data}, every shard matching the manifest (content hash {manifest['content_hash'][:16]}...)")
    return manifest


def _check_inputs(layout, build: BuildConfig):
    """Before anything is written: the output is writable, the LM and the index are usable. Returns the
    tokenizer, the window L and the forbidden evaluation titles."""
    from ralm.files import check_writable
    from ralm.retrieval import check_index

    check_writable(layout.root, "--out")
    tokenizer, window = check_model(build)
    check_index(build.retrieval.index)
    return tokenizer, window, forbidden_from_eval(build)


def _clean_after_kill(layout) -> None:
    """Rank 0: drop a killed run's old temporaries (not a live writer's on another node) and the shards
    whose bytes no longer match the hash recorded when they were written."""
    from .shards import drop_bad_shards

    for f in layout.root.rglob(".*.tmp"):
        if time.time() - f.stat().st_mtime > 600:
            f.unlink(missing_ok=True)
    bad = drop_bad_shards(layout)
    if bad:
        log(f"{len(bad)} shard(s) no longer match the hash recorded when written ({bad[:3]}); scoring them again")


# ---------------------------------------------------------------------------------------------
# CLI


def build(examples: int = 300_000, seed: int = 0, shard_size: int = 1000, model: str = "gpt2",
          text: Text = WIKITEXT103_TRAIN, eval_text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
          windows: Windows = Windows(), out: str = "checkpoints/data_gen", stage: str = "all", batch_examples: int = 8,
          scoring: Scoring = Scoring(), num_workers: int = 0, retrieval_batch: int = 256, keep_work: bool = False,
          trainer: Devices = Devices(), verbose: bool = False, progress: bool = True,
          exclude_source: bool = True) -> dict | None:
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
    """
    b = BuildConfig(examples=examples, seed=seed, shard_size=shard_size, model=model, text=text, eval_text=eval_text,
                    retrieval=retrieval, windows=windows, exclude_source=exclude_source)
    r = RunConfig(out=out, stage=stage, batch_examples=batch_examples, scoring=scoring, num_workers=num_workers,
                  retrieval_batch=retrieval_batch, keep_work=keep_work, trainer=trainer, verbose=verbose,
                  progress=progress)
    trainer.kwargs(one_process=scoring.device_map is not None)  # a bad device combination fails before any work
    from ralm.lock import claim

    with claim(r.out, "--out"):  # a second build on the same --out is refused, not mixed in
        return build_dataset(b, r)


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(build, argv, "python -m data_gen.build", description=__doc__, after=lambda m, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
