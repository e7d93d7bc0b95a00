"""Carry out a plan: each step's command in this process (sparing a 2-core machine ~10-15 s of imports a
step), finished steps skipped, everything printed also into ``OUT/pipeline.log``, and a stop that keeps what
is done.

A step is the command's own ``main`` (:func:`ralm.cli.run_module`), so it behaves as it does from a shell:
it resumes after a kill by itself, and its exit status stops the pipeline when it is not 0. SIGTERM (``kill``,
a scheduler's time limit) stops the running step the way that command stops on it (a fit saves ``last.ckpt``;
the scoring stages finish their batch) and the pipeline exits 143; rerun the same command to continue.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Iterator, TextIO

import numpy as np

import data_gen.build
import eval.ppl
from data_gen.scores_file import shard_hashes
from pipeline.plan import Recipe, Step, plan
from pipeline.report import write_judge_curve, write_report
from pipeline.stamps import Ledger, describe_stale
from pipeline.texts import write_texts
from ralm.cli import run_module
from ralm.files import file_sha256
from ralm.lock import claim
from ralm.models import ModelError, resolve
from ralm.settings import InputError


class _Tee:
    """A stream that writes to the terminal (or pipe) and to the log file."""

    def __init__(self, stream: TextIO, log: TextIO):
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.log.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def logged(path: Path) -> Iterator[None]:
    """stdout and stderr also appended to ``path`` while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = out, err


def _on_sigterm(signum, frame) -> None:
    # Inside a Lightning run its own handler (which calls this one too) stops the step cleanly at the next
    # batch; between them, stop here: every file is written under a temporary name and renamed.
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        raise SystemExit(128 + 15)


def say(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def run_step(r: Recipe, step: Step) -> int:
    """One step's exit status."""
    try:
        if step.module != "pipeline":
            return run_module(step.module, step.argv)
        if step.stage == "split":
            for line in write_texts(r):
                say(f"  {line}")
        elif step.stage == "judge":
            wrote = write_judge_curve(r)
            say(f"  wrote {wrote}" if wrote else "  no curve: the fits do not differ in the data they read")
        else:
            say(f"  wrote {write_report(r)}")
        return 0
    except InputError as e:
        say(f"error: {' '.join(str(e).split())}")
        return 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        return 130


#: The commands whose settings the pipeline checks before its first step: ``check(argv)`` of each module.
CHECKED = {"data_gen.build": data_gen.build.check, "eval.ppl": eval.ppl.check}


def check(steps: list[Step]) -> None:
    """Every pending step's settings as its command would check them, before any step runs: a bad value in a
    recipe's ``set:`` fails now, not after the stages before it (raises the command's :class:`InputError`)."""
    for step in steps:
        if step.module in CHECKED and not step.finished():
            try:
                CHECKED[step.module](step.argv)
            except InputError as e:
                raise InputError(f"{step.stage} step '{step.title}': {' '.join(str(e).split())}") from None


def check_inputs(r: Recipe, steps: list[Step]) -> None:
    """The recipe's input files exist when a stage that reads them is to run (split, index, data): a missing one
    is named, with the recipe's ``prepare`` command that makes it."""
    if not any(s.stage in ("split", "index", "data") and not s.finished() for s in steps):
        return
    missing = [f"{what} {path}" for what, path in r.inputs() if not Path(path).exists()]
    if missing:
        raise InputError(f"{'; '.join(missing)}: no such file" + (f"; make it first: {r.prepare}" if r.prepare else
                                                                    "; fix the path in the recipe"))


#: Architectures (``config.json``) of a causal LM: what the recipe's ``lm`` must be and its ``encoder`` must not.
CAUSAL = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_models(r: Recipe, steps: list[Step]) -> None:
    """The recipe's LM and encoder, where a pending step reads them: resolved (a short name not fetched yet is
    named with its fetch command) and of the right kind (an LM that is not a causal LM, an encoder that is one),
    before the first stage rather than when its stage starts."""
    pending = {s.stage for s in steps if not s.finished()}
    for what, spec, stages, causal in (("lm", r.lm, {"data"} if r.eval.lm else {"data", "eval"}, True),
                                       ("eval.lm", r.eval.lm, {"eval"}, True), ("encoder", r.encoder, {"fit"}, False)):
        if not spec or not pending & stages:
            continue
        try:
            where = resolve(spec)
        except ModelError as e:
            raise InputError(f"{what}: {e}") from None
        config = Path(where.path) / "config.json"
        if where.gguf_file or not config.is_file():  # a GGUF file is a causal LM; a hub id is checked when loaded
            if where.gguf_file and not causal:
                raise InputError(f"encoder {spec!r} is a GGUF causal LM; the reranker's encoder is a bidirectional "
                                 "encoder (e.g. minilm-l6, a BERT or RoBERTa directory)")
            continue
        archs = json.loads(config.read_text()).get("architectures") or []
        is_causal = any(a.endswith(CAUSAL) for a in archs)
        if archs and is_causal != causal:
            raise InputError(f"{what} {spec!r} is {'/'.join(archs)}: " + (
                "not a causal LM; the LM reads the passages and the text (e.g. smollm2-135m, a GPT-2 directory)"
                if causal else "a causal LM; the reranker's encoder is a bidirectional encoder (e.g. minilm-l6, a "
                "BERT or RoBERTa directory); the causal LM goes in `lm:`"))


def run(r: Recipe, steps: list[Step]) -> int:
    """Carry out ``steps`` (skipping finished ones); the exit status of the first that fails, else 0."""
    ledger = Ledger(r, plan(r))
    try:
        check(steps)
        check_models(r, steps)
        check_inputs(r, steps)
        for step in steps:
            why = ledger.stale(step)
            if why:
                raise InputError(describe_stale(step, why))
    except InputError as e:
        say(f"error: {e}; nothing was run")
        return 2
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    t0 = time.time()
    try:
        with claim(r.root, "--out"), logged(r.root / "pipeline.log"):  # one pipeline a run directory
            say(f"{len(steps)} step(s) for {r.out} ({time.strftime('%Y-%m-%d %H:%M:%S')}); log: {r.root / 'pipeline.log'}")
            for i, step in enumerate(steps, 1):
                head = f"{i}/{len(steps)} {step.stage}: {step.title}"
                if step.finished():
                    say(f"{head}: done already")
                    continue
                say(f"{head}\n  $ {step.command()}")
                t = time.time()
                rc = run_step(r, step)
                if rc:
                    why = {143: "stopped by SIGTERM", 130: "interrupted"}.get(rc, f"failed (exit {rc})")
                    say(f"{head}: {why}; the finished steps and this step's saved work are kept: fix what it says "
                        "and rerun the same command to continue")
                    return rc
                say(f"{head}: finished in {time.time() - t:.0f}s")
                if step.finished():
                    ledger.record(step)
                if step.stage == "data" and step.finished() and "assembled" in step.title:
                    training = step.done.parent == r.root / "data"
                    _check_scores(step.done.parent, r.data if training else r.judge, "training data" if training
                                  else "the judge's data")
            say(f"all {len(steps)} step(s) done in {time.time() - t0:.0f}s"
                + (f"; report: {r.root / 'report' / 'report.md'}" if any(s.stage == "report" for s in steps) else ""))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _check_scores(out: Path, data, label: str) -> None:
    """With imported scores (``data``: the recipe's data or judge): say whether the assembled dataset in ``out``
    is the scores files' one, byte for byte (whole files: the content hash; parts: each shard's sha256; a part of
    the dataset, ``first_shards``: each shard written)."""
    manifest = out / "manifest.json"
    if not data.scores:
        return
    files = data.scores_files
    if not manifest.is_file():
        recorded = shard_hashes(files)
        written = sorted(out.glob("train-*.parquet"))
        differ = [f.name for i, f in enumerate(written) if i in recorded and file_sha256(f) != recorded[i]]
        say(f"{label}: {len(written)} shard(s) written (a part of the dataset), " + (
            "each the scores files' byte for byte" if not differ else f"{len(differ)} differing from the scores "
            "files' (shard bytes differ with the pyarrow version; the rows were checked against the retrieval by "
            "data_gen.build)"))
        return
    m = json.loads(manifest.read_text())
    with np.load(files[0]) as z:
        theirs = str(z["content_hash"])
    if len(files) == 1 and theirs:
        same, what = m["content_hash"] == theirs, f"the scores file's was {theirs[:16]}…"
    else:
        recorded = shard_hashes(files)
        same = all(recorded.get(i) == s["sha256"] for i, s in enumerate(m["shards"]) if i in recorded)
        what = f"{sum(recorded.get(i) != s['sha256'] for i, s in enumerate(m['shards']) if i in recorded)} shard(s) differ"
    say(f"{label} content hash {m['content_hash'][:16]}…: " + ("the scores files' dataset, byte for byte" if same
        else f"{what} (shard bytes differ with the pyarrow version; the rows were checked against the retrieval by "
             "data_gen.build)"))
