"""One ``data_gen.build`` job: its inputs checked before anything is written, then its stages in turn.

Each stage lives in its module (``sample.run_sample``, ``retrieve.start_retrieve``, ``score.run_score``,
``shards.assemble_shard`` and ``shards.write_manifest``); :func:`build_dataset` checks the inputs and runs them,
resuming what a killed run left.
"""

from __future__ import annotations

import json
import shutil
import time

from ralm.articles import forbidden_titles
from ralm.cli import quiet_libraries
from ralm.files import check_writable
from ralm.loading import check_causal_lm, load_config, load_tokenizer
from ralm.lock import global_rank
from ralm.models import ModelError
from ralm.retrieval import check_index
from ralm.settings import InputError
from ralm.scoring import context_length

from .config import BuildConfig, BuildError, RunConfig, load_text, log
from .retrieve import start_retrieve
from .sample import run_sample
from .score import run_score
from .shards import Layout, assemble_shard, check_config, drop_bad_shards, verify_manifest, write_manifest

# ---------------------------------------------------------------------------------------------
# inputs, checked before anything is written


def check_model(build: BuildConfig):
    """The LM's tokenizer and the tokens of its rows (L clipped to the LM's context, L + (m - 1) * s with
    ``--targets.extend``), after the causal-LM and vocabulary checks."""
    try:
        tok, cfg = load_tokenizer(build.model), load_config(build.model)
        check_causal_lm(build.model, cfg, tok)
    except ModelError as e:
        raise BuildError(str(e) if "--model" in str(e) else f"--model: {e}") from None
    context = context_length(cfg)
    window = build.windows.fitted(context)
    build.retrieval.check_windows(build.windows, window)
    window = build.targets.scoring_window(window, build.windows.stride)  # what an LM row holds
    if window > context:
        raise BuildError(f"--targets.extend makes LM rows of L + (m - 1) * s = {window} tokens, more than the LM's "
                         f"context ({context}); lower --windows.max_length or --targets.per_window")
    build.check_targets(window)
    return tok, window


def forbidden_from_eval(build: BuildConfig) -> set[str]:
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
    quiet_libraries(run.verbose)
    layout = Layout(run.out, build)
    rank0 = global_rank() == 0
    resumed = check_config(layout)
    if layout.manifest.exists():
        return _already_complete(layout, rank0)
    try:
        return _build(layout, build, run, rank0)
    except (BuildError, InputError):
        if rank0 and not resumed:
            _forget_failed_start(layout)
        raise


def _forget_failed_start(layout) -> None:
    """A run that wrote config.json itself and failed on its inputs before any example was scored removes what
    it wrote, so that the corrected command is not refused as another configuration."""
    if layout.existing_shards() or (layout.scores_dir.is_dir() and any(layout.scores_dir.iterdir())):
        return
    layout.config.unlink(missing_ok=True)
    layout.text_record.unlink(missing_ok=True)
    shutil.rmtree(layout.work, ignore_errors=True)


def _build(layout, build: BuildConfig, run: RunConfig, rank0: bool) -> dict | None:
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

    wanted = min(build.n_shards, run.first_shards or build.n_shards)
    writer = run_score(layout, run, window, rank0, min(build.examples, wanted * build.shard_size), shard_done)
    if thread is not None:
        thread.join()
        if thread.error is not None:
            raise thread.error
    if not writer:
        return None
    for s in range(wanted):
        if not assemble_shard(layout, s, tokens, tokenizer, window):
            raise BuildError(f"shard {s} has unscored examples after scoring; rerun the same command")
    if wanted < build.n_shards:
        log(f"[score] the first {wanted} of {build.n_shards} shards are written ({wanted * build.shard_size:,} of "
            f"{build.examples:,} examples, {layout.data}); the dataset is not complete: the same command with a "
            "larger --first_shards, or without it, continues")
        return None
    return write_manifest(layout, run, window, tokenizer, len(tokens))


def _already_complete(layout, rank0: bool) -> dict:
    """A finished job: check every shard against its manifest and return the manifest."""
    try:
        manifest = json.loads(layout.manifest.read_text())
        if not isinstance(manifest, dict) or not {"shards", "examples", "content_hash"} <= set(manifest):
            raise ValueError("not a data_gen manifest")
    except ValueError as e:
        raise BuildError(f"{layout.manifest} is not a readable data_gen manifest ({e}); delete it and rerun the same "
                         "command: the shards are checked against their recorded hashes and kept") from None
    verify_manifest(layout, manifest)
    if rank0:
        log(f"already complete: {manifest['examples']:,} examples in {len(manifest['shards'])} shard(s) under "
             f"{layout.data}, every shard matching the manifest (content hash {manifest['content_hash'][:16]}...)")
    return manifest


def _check_inputs(layout, build: BuildConfig):
    """Before anything is written: the output is writable, the LM and the index are usable. Returns the
    tokenizer, the window L and the forbidden evaluation titles."""
    check_writable(layout.root, "--out")
    tokenizer, window = check_model(build)
    check_index(build.retrieval.index)
    return tokenizer, window, forbidden_from_eval(build)


def _clean_after_kill(layout) -> None:
    """Rank 0: drop a killed run's old temporaries (not a live writer's on another node) and the shards
    whose bytes no longer match the hash recorded when they were written."""
    for f in layout.root.rglob(".*.tmp"):
        if time.time() - f.stat().st_mtime > 600:
            f.unlink(missing_ok=True)
    bad = drop_bad_shards(layout)
    if bad:
        log(f"{len(bad)} shard(s) no longer match the hash recorded when written ({bad[:3]}); scoring them again")
