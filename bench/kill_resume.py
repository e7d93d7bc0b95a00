"""Stop each long job at random moments (SIGKILL, SIGTERM or Ctrl-C), rerun the same command, compare with an
unbroken run.

    python bench/kill_resume.py                    # 10 SIGKILLs per job (about 10-20 minutes on 2 cores)
    python bench/kill_resume.py --kills 3 --jobs eval
    python bench/kill_resume.py --kills 3 --signal TERM INT   # SIGTERM to the PID, SIGINT to the process group

A SIGKILL goes to the job's whole process group (nothing survives it); a SIGTERM to the job's PID alone (a
scheduler's stop; its children must follow it); a SIGINT to the process group (Ctrl-C in a terminal). A SIGTERM or
SIGINT trial also checks the stop itself: exit status 143 / 130 as a shell reports it (or 0 where the signal came
after the job's work was done), no traceback, and no process of its group left a few seconds later (a search
process or data loader outliving the job).

For ``data_gen.build``, ``eval.ppl`` and ``reranking.fit`` (tiny models and a real Lucene index made
here, so it runs offline): one uninterrupted run; then ``--kills`` trials, each into a fresh output:
start the same command, SIGKILL its whole process group (search process included) at a random
moment of the unbroken run's duration, rerun the command to the end, and compare with the unbroken
run: the content hash (data_gen), perplexity and every per-token NLL (eval), every exported weight
(fit). A trial proves resuming only if partial state existed at the kill and the rerun used it, so
each trial also records what was saved at the kill (finished shards and retrieval files; finished
chunks; ``last.ckpt``) and whether the rerun kept it rather than redoing it (the same files untouched;
for fit, the rerun resumed from the checkpoint). The run fails if a trial's saved state was redone or
no trial had any.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def start(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def unbroken(args: list[str], log) -> float:
    t = time.time()
    p = start(args, log)
    if p.wait() != 0:
        raise SystemExit(f"unbroken run failed: {' '.join(args)} (log: {log.name})")
    return time.time() - t


def snapshot(files) -> dict[str, tuple[int, int]]:
    """Identity of each file (inode, mtime): a file rewritten by the rerun no longer matches."""
    out = {}
    for f in files:
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        out[str(f)] = (st.st_ino, st.st_mtime_ns)
    return out


#: How each signal is sent, and the exit status a clean stop gives (None: SIGKILL, which nothing can handle).
SIGNALS = {"KILL": (signal.SIGKILL, "group", None), "TERM": (signal.SIGTERM, "pid", 143),
           "INT": (signal.SIGINT, "group", 130)}


def group_left(pgid: int, wait: float = 5.0) -> bool:
    """Whether any process of the group is still there ``wait`` seconds on (then killed, to leave none)."""
    t = time.time() + wait
    while time.time() < t:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    return True


def killed(args: list[str], out: Path, duration: float, rng: random.Random, log, saved,
           sig: str = "KILL") -> tuple[float, int, int, bool]:
    """One trial: start the job, send ``sig`` (see :data:`SIGNALS`) at a random moment before it would finish,
    then rerun the same command to the end. A run that finishes before its kill (the machine is faster
    than during the unbroken run) is deleted and tried again with an earlier moment.

    ``saved(out, rerun_log)`` lists the finished units on disk (called at the kill with ``rerun_log``
    None, then after the rerun) and returns ``(units, reused)``. Returns (moment, units saved at the
    kill, units the rerun reused, whether the stop was clean: its exit status, no traceback, no process left)."""
    import shutil

    number, to, status = SIGNALS[sig]
    scale = 1.0
    while True:
        log.flush()
        start_at = Path(log.name).stat().st_size
        p = start(args, log)
        delay = rng.uniform(0.05, 0.95) * duration * scale
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            (os.killpg if to == "group" else os.kill)(p.pid, number)
            rc = p.wait()
            left = group_left(p.pid)
            break
        shutil.rmtree(out, ignore_errors=True)
        scale *= 0.7
    log.flush()
    with open(log.name, "rb") as f:
        f.seek(start_at)
        stopped_log = f.read().decode(errors="replace")
    # the status as a shell reports it: a process that ended by the signal itself (-N) is 128 + N; 0 where the
    # signal came after the job had finished its work (nothing left to stop)
    clean = status is None or (rc in (status, 128 - status, 0) and
                               "Traceback" not in stopped_log and not left)
    if not clean:
        print(f"  {sig} at {delay:.1f} s: exit {rc}, traceback {'Traceback' in stopped_log}, processes left {left}: "
              f"{' '.join(args[:1])} (log: {log.name})", flush=True)
    at_kill = saved(out, None)
    log.flush()
    mark = Path(log.name).stat().st_size
    p = start(args, log)
    if p.wait() != 0:
        raise SystemExit(f"the rerun after the kill failed: {' '.join(args)} (log: {log.name})")
    with open(log.name, "rb") as f:
        f.seek(mark)
        rerun_log = f.read().decode(errors="replace")
    return delay, len(at_kill), saved(out, (at_kill, rerun_log)), clean


def files_kept(files):
    """``saved`` for jobs whose finished units are files that a resumed run keeps untouched."""
    def saved(out: Path, after):
        now = snapshot(files(out))
        if after is None:
            return now
        at_kill, _ = after
        return sum(now.get(f) == ident for f, ident in at_kill.items())
    return saved


def fit_resumed(run_dir):
    def saved(out: Path, after):
        last = run_dir(out) / "checkpoints" / "last.ckpt"
        if after is None:
            return {str(last): 1} if last.is_file() else {}
        at_kill, rerun_log = after
        return int(bool(at_kill) and "resuming from" in rerun_log)
    return saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--jobs", nargs="+", default=["data_gen", "eval", "fit"], choices=["data_gen", "eval", "fit"])
    ap.add_argument("--signal", nargs="+", default=["KILL"], choices=list(SIGNALS),
                    help="KILL (to the process group), TERM (to the PID), INT (to the process group, as Ctrl-C)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    a = ap.parse_args(argv)
    import numpy as np
    import torch

    from ralm.tiny import make_gpt2, make_roberta, train_tokenizer, wikitext_articles

    rng = random.Random(a.seed)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="kill_resume_"))
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"--workdir {work} is not empty; pass a new one")
    work.mkdir(parents=True, exist_ok=True)
    log = open(work / "log.txt", "a")
    print(f"workdir {work} (logs: {log.name})", flush=True)
    text = wikitext_articles(n_articles=300, seed=1)
    (work / "corpus.txt").write_text(text)
    body = text[text.index(" = ", 10):][:6000]
    (work / "eval.txt").write_text(body)
    if not (work / "corpus" / "index").is_dir():
        subprocess.run([sys.executable, "-m", "ralm.corpus", "--text.file", str(work / "corpus.txt"), "--out",
                        str(work / "corpus")], cwd=ROOT, env=ENV, check=True, stdout=log, stderr=subprocess.STDOUT)
    lm, enc = work / "lm", work / "enc"
    if not (lm / "config.json").exists():
        make_gpt2(lm, train_tokenizer([text[:50000]], lm, vocab_size=512), n_layer=2, n_embd=64, n_head=2, seed=0)
        make_roberta(enc, train_tokenizer([text[:50000]], enc, vocab_size=600, kind="roberta"), num_hidden_layers=2,
                     hidden_size=32, num_attention_heads=2, seed=0)
    index = str(work / "corpus" / "index")
    small = ["--windows.max_length", "128", "--windows.doc_max_tokens", "48", "--retrieval.k", "8",
             "--trainer.accelerator", "cpu", "--progress", "false", "--keep_work", "true"]
    report = []

    def build_args(out):
        return ["data_gen.build", "--model", str(lm), "--text.file", str(work / "corpus.txt"), "--eval_text.file",
                str(work / "eval.txt"), "--retrieval.index", index, "--examples", "600", "--shard_size", "100",
                "--out", str(out), *small]

    data = work / "dg-ref"
    if "data_gen" in a.jobs or "fit" in a.jobs:
        t = unbroken(build_args(data), log)
    if "data_gen" in a.jobs:
        ref = json.loads((data / "manifest.json").read_text())["content_hash"]
        dg_units = files_kept(lambda out: [*out.glob("train-*.parquet"), *(out / "work" / "retrieved").glob("*.parquet")])
        for sig in a.signal:
            same, trials = 0, []
            for i in range(a.kills):
                out = work / f"dg-{sig}-trial{i}"
                trials.append(killed(build_args(out), out, t, rng, log, dg_units, sig))
                same += json.loads((out / "manifest.json").read_text())["content_hash"] == ref
            report.append(("data_gen.build", sig, t, trials, "content hash", same))

    if "eval" in a.jobs:
        def eval_args(out):
            return ["eval.ppl", "--model", str(lm), "--text.file", str(work / "eval.txt"), "--retrieval.index", index,
                    "--reranker", "zero-shot", "--chunk_strides", "16", "--output_dir", str(out), *small]

        t = unbroken(eval_args(work / "ppl-ref"), log)
        r1 = json.loads((work / "ppl-ref" / "results.json").read_text())
        nll1 = np.load(work / "ppl-ref" / "tokens.npz")["nll"]
        chunk_units = files_kept(lambda out: (out / "work" / "chunks").glob("*.npz"))
        for sig in a.signal:
            same, trials = 0, []
            for i in range(a.kills):
                out = work / f"ppl-{sig}-trial{i}"
                trials.append(killed(eval_args(out), out, t, rng, log, chunk_units, sig))
                r2 = json.loads((out / "results.json").read_text())
                same += r1["ppl_word"] == r2["ppl_word"] and np.array_equal(nll1, np.load(out / "tokens.npz")["nll"])
            report.append(("eval.ppl", sig, t, trials, "perplexity and every per-token NLL", same))

    if "fit" in a.jobs:
        def fit_args(version):
            return ["reranking.fit", "--model.encoder", str(enc), "--model.pretrained", "false",
                    "--model.input.max_length", "96", "--model.input.max_prefix_tokens", "32", "--model.optimizer.lr",
                    "1e-3", "--model.optimizer.warmup_steps", "4",
                    "--data.data_dir", str(data), "--data.batch_size", "8", "--data.max_candidates", "8",
                    "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
                    "--trainer.max_steps", "60", "--trainer.val_check_interval", "5",
                    "--trainer.check_val_every_n_epoch", "null", "--trainer.enable_progress_bar", "false",
                    "--trainer.logger.init_args.save_dir", str(work / "fit"),
                    "--trainer.logger.init_args.version", version]

        from safetensors.torch import load_file

        t = unbroken(fit_args("ref"), log)
        w1 = load_file(work / "fit" / "reranker" / "ref" / "reranker" / "model.safetensors")
        for sig in a.signal:
            same, trials = 0, []
            for i in range(a.kills):
                out = work / "fit" / "reranker" / f"{sig}-trial{i}"
                trials.append(killed(fit_args(f"{sig}-trial{i}"), out, t, rng, log, fit_resumed(lambda out: out), sig))
                w2 = load_file(out / "reranker" / "model.safetensors")
                same += w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
            report.append(("reranking.fit", sig, t, trials, "every exported weight", same))

    print("\n| job | signal | unbroken run | stopped at (s) | saved at the stop (units per trial) | trials with saved "
          "state, all of it reused | clean stops (exit status, no traceback, no process left) | compared | identical to "
          "the unbroken run |")
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for job, sig, t, trials, what, same in report:
        with_state = [tr for tr in trials if tr[1] > 0]
        reused = sum(tr[2] == tr[1] for tr in with_state)
        clean = sum(tr[3] for tr in trials)
        ok &= same == clean == len(trials) and reused == len(with_state) > 0
        print(f"| {job} | {sig} | {t:.0f} s | {', '.join(f'{tr[0]:.0f}' for tr in trials)} | "
              f"{', '.join(str(tr[1]) for tr in trials)} | {len(with_state)} of {len(trials)}, {reused} | "
              f"{'n/a (SIGKILL)' if sig == 'KILL' else f'{clean} of {len(trials)}'} | {what} | {same} of {len(trials)} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
