"""End-to-end reranker training on CPU: logs, checkpoints, resume, export, selector, and DDP metrics."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def fit_args(encoder, data_dir, max_steps, *extra):
    return ["--model.encoder", str(encoder), "--model.pretrained", "false", "--model.input.max_length", "96",
            "--model.input.max_prefix_tokens", "32", "--model.optimizer.lr", "1e-3", "--model.optimizer.warmup_steps", "2",
            "--model.optimizer.total_steps", "40", "--data.data_dir", str(data_dir), "--data.batch_size", "4",
            "--data.val_fraction", "0.25", "--data.num_workers", "0", "--trainer.accelerator", "cpu",
            "--trainer.devices", "1", "--trainer.max_steps", str(max_steps), "--trainer.val_check_interval", "4",
            "--trainer.check_val_every_n_epoch", "null", "--trainer.log_every_n_steps", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra]


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing import event_accumulator

    out = {}
    for f in sorted(glob.glob(str(run_dir / "events.out.tfevents.*"))):
        acc = event_accumulator.EventAccumulator(f)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, tiny_roberta_dir, rerank_data_dir):
    """Train 8 steps, resume from last.ckpt to 12 steps (in the same run directory), and train 12 steps
    without a break elsewhere. Returns what the tests look at."""
    import shutil

    from reranking.fit import main

    work = tmp_path_factory.mktemp("fit")
    old_cwd, old_argv = os.getcwd(), sys.argv
    sys.argv = ["reranking.fit"]
    try:
        os.chdir(work)
        first = main(fit_args(tiny_roberta_dir, rerank_data_dir, 8))
        assert first.trainer.global_step == 8
        run = work / first.trainer.log_dir
        after_first = {"scalars": scalars(run), "ckpts": sorted(p.name for p in (run / "checkpoints").iterdir())}
        shutil.copytree(run / "reranker", work / "export-after-8")
        resumed = main(fit_args(tiny_roberta_dir, rerank_data_dir, 12, "--ckpt_path",
                                str(run / "checkpoints" / "last.ckpt")))
        assert resumed.trainer.global_step == 12
        straight_dir = tmp_path_factory.mktemp("fit_straight")
        os.chdir(straight_dir)
        straight = main(fit_args(tiny_roberta_dir, rerank_data_dir, 12))
        assert straight.trainer.global_step == 12
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    return {"work": work, "run": run, "resumed_run": work / resumed.trainer.log_dir, "after_first": after_first,
            "straight_run": straight_dir / straight.trainer.log_dir}


def test_fit_logs_checkpoints_and_exports(fitted):
    work, run1 = fitted["work"], fitted["run"]
    assert run1.is_relative_to(work / "checkpoints")
    tags = fitted["after_first"]["scalars"]
    for tag in ["train/loss", "train/lr", "val/loss", "val/nll_reranker", "val/nll_bm25", "val/nll_oracle",
                "val/gap_captured", "val/top1_agreement", "val/mrr", "val/ndcg", "val/nll_nodoc"]:
        assert tag in tags, f"{tag} missing from TensorBoard; have {sorted(tags)}"
    assert len(tags["train/loss"]) == 8 and len(tags["val/nll_reranker"]) == 2
    lrs = [v for _, v in sorted(tags["train/lr"])]
    # linear warm-up from 0 over 2 steps, then linear decay (transformers' get_linear_schedule_with_warmup)
    assert lrs[:3] == pytest.approx([0.0, 0.5e-3, 1e-3]) and lrs[-1] < lrs[2]
    nll = {k: tags[f"val/nll_{k}"][-1][1] for k in ("reranker", "bm25", "oracle")}
    assert nll["oracle"] <= nll["reranker"] and nll["oracle"] <= nll["bm25"]
    assert tags["val/gap_captured"][-1][1] == pytest.approx(
        (nll["bm25"] - nll["reranker"]) / (nll["bm25"] - nll["oracle"]), rel=1e-4)
    ckpts = fitted["after_first"]["ckpts"]
    assert "last.ckpt" in ckpts and any(c.startswith("best-") for c in ckpts), ckpts
    assert (run1 / "config.yaml").is_file()  # resolved config saved with the run
    assert {"model.safetensors", "encoder_config.json", "config.json", "README.md", "reranker.json"} <= {
        p.name for p in (run1 / "reranker").iterdir()}


def test_resume_continues_in_place_and_equals_an_unbroken_run(fitted):
    run = fitted["run"]
    assert fitted["resumed_run"] == run  # same run directory: one TensorBoard curve, one best-checkpoint record
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]
    steps = sorted(s for s, _ in scalars(run)["train/loss"])
    assert steps == list(range(12))  # picks up at step 8, nothing logged twice
    assert dict(scalars(run)["train/lr"]) == pytest.approx(dict(scalars(fitted["straight_run"])["train/lr"]))
    a = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(fitted["straight_run"] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 12
    for k in b["state_dict"]:  # same batches in the same order, same dropout draws: the same weights
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k


def test_export_and_checkpoint_load_to_the_same_selector(fitted, tiny_roberta_dir, tmp_path):
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import load_reranker

    run1 = fitted["run"]
    export_dir = run1 / "reranker"
    bests = [p for p in (run1 / "checkpoints").iterdir() if p.name.startswith("best-")]
    assert len(bests) == 1, bests
    best = bests[0]
    m1, tok, fmt = load_reranker(export_dir)
    m2, _, fmt2 = load_reranker(best)
    assert fmt == fmt2 and fmt.max_length == 96 and fmt.max_prefix_tokens == 32
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)  # the export holds the best checkpoint's weights
    trained = json.loads((export_dir / "reranker.json").read_text())["trained"]  # ... and says from which step
    assert trained["steps"] == torch.load(best, map_location="cpu", weights_only=True)["global_step"]
    assert trained["fit_steps"] == 12  # the resumed fit wrote this export
    cands = [[Passage(f"d{i}{j}", f"Title {j}", f"text {i} {j} " * (j + 1), 10.0 - j) for j in range(n)]
             for i, n in enumerate([3, 0, 5, 1])]
    batch = StrideBatch(prefix_texts=["the city was", "a river", "the album of the year", "x"], candidates=cands,
                        stride_ids=[1, 2, 3, 4])
    sel1 = PredictiveSelector.from_path(export_dir, batch_size=1)
    sel2 = PredictiveSelector.from_path(best, batch_size=7)
    s1, s2 = sel1.scores(batch), sel2.scores(batch)
    for a, b in zip(s1, s2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # micro-batch size does not matter
    picks = sel1.select(batch)
    assert picks[1] == -1 and picks[3] == 0 and 0 <= picks[0] < 3 and picks == sel2.select(batch)
    assert picks[2] == int(s1[2].argmax())
    with pytest.raises(ValueError, match="not a reranker export"):
        load_reranker(tiny_roberta_dir)
    # an export copied in part: refused whole, never scored with a fallback tokenizer or half its weights
    no_tok, cut = tmp_path / "no-tokenizer", tmp_path / "truncated"
    shutil.copytree(export_dir, no_tok)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="lacks its tokenizer files"):
        load_reranker(no_tok)
    shutil.copytree(export_dir, cut)
    weights = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_reranker(cut)
    # library use: scores and order for one prefix
    import reranking

    scores, order = reranking.load(export_dir).rank(batch.prefix_texts[2], [c.document() for c in cands[2]])
    torch.testing.assert_close(torch.tensor(scores), s1[2], rtol=1e-4, atol=1e-5)
    assert order[0] == picks[2] and sorted(order) == list(range(5))
    assert [scores[j] for j in order] == sorted(scores, reverse=True)


def test_ddp_validation_metrics_equal_single_process(tmp_path, tiny_roberta_dir, rerank_data_dir):
    """2-process gloo DDP fit; its final validation metrics must equal a 1-process validation of the same weights."""
    import lightning.pytorch as pl

    from reranking.data import RerankDataModule
    from reranking.system import RerankerSystem

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--trainer.strategy", "ddp", "--trainer.devices", "2",
                    "--trainer.deterministic", "true", "--trainer.precision", "32-true")  # as the check below
    proc = subprocess.run([sys.executable, "-m", "reranking.fit", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = next((tmp_path / "checkpoints" / "reranker").iterdir())
    ddp = {k: v[-1][1] for k, v in scalars(run).items() if k.startswith("val/")}

    system = RerankerSystem.load_from_checkpoint(run / "checkpoints" / "last.ckpt", map_location="cpu",
                                                 weights_only=True)
    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, batch_size=4, num_workers=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    single = {k: float(v) for k, v in trainer.validate(system, datamodule=dm, verbose=False)[0].items()}
    assert set(ddp) == set(single)
    for k in ddp:
        assert ddp[k] == pytest.approx(single[k], rel=1e-5, abs=1e-6), k


def test_the_training_order_follows_the_seed_unless_given(tmp_path, tiny_roberta_dir, rerank_data_dir, monkeypatch):
    """A training seed varies the data order: the loader the fit trained on is shuffled by
    ``--seed_everything`` unless ``--data.shuffle_seed`` is given (then by that); without any seed, 0."""
    from reranking.data import RerankDataModule
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)  # the default logger writes ./checkpoints
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    orders = {}
    for extra, seed in (([], 0), (["--seed_everything", "3"], 3), (["--seed_everything", "3", "--data.shuffle_seed",
                                                                     "5"], 5)):
        loader = main(fit_args(tiny_roberta_dir, rerank_data_dir, 1, *extra)).trainer.train_dataloader
        assert loader._batches.seed == seed, extra
        orders[seed] = loader._batches._batches()
    assert orders[0] != orders[3] != orders[5]
    monkeypatch.delenv("PL_GLOBAL_SEED")
    assert RerankDataModule(str(rerank_data_dir)).shuffle_seed() == 0


def test_corrupt_or_foreign_checkpoint_is_one_line(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys, monkeypatch):
    """--ckpt_path that is truncated/corrupt or not from reranking.fit: exit 2, one line, nothing built."""
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)  # the default logger writes ./checkpoints

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a torch file")
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    for path, match in ((garbage, "not a readable checkpoint"), (foreign, "not a checkpoint of reranking.fit")):
        assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--ckpt_path", str(path))) == 2
        err = capsys.readouterr().err
        assert match in err and "--ckpt_path" in err and err.count("\n") == 1, err
    assert not (tmp_path / "checkpoints").exists() and not list(tmp_path.glob("**/version_*"))
    # a cross-encoder's checkpoint resumed into a bi-encoder fit: one line naming both, not a state-dict traceback
    cross = main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--trainer.logger.init_args.version", "cross"))
    last = Path(cross.trainer.checkpoint_callback.last_model_path)
    capsys.readouterr()
    assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--model.architecture", "bi", "--ckpt_path", str(last))) == 2
    err = capsys.readouterr().err
    assert "is a cross-encoder's checkpoint and this fit trains a bi-encoder" in err and err.count("\n") == 1, err


def test_an_export_dir_in_use_is_refused_before_training(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                          monkeypatch):
    """While another run holds --export_dir (here this process, through the same lock), a fit is refused
    with one line before its first step, and the directory is left as it was."""
    from ralm.lock import claim
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    export = tmp_path / "export"
    with claim(export, "--export_dir"):
        assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--export_dir", str(export))) == 2
        assert sorted(p.name for p in export.iterdir()) == [".lock"]  # the holder's lock, nothing of the refused fit
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--export_dir" in errors[0] and str(export) in errors[0] and "in use by pid" in err, err
    assert not export.exists()  # the holder made it and left nothing in it: its lock went with it
    assert not list(tmp_path.glob("checkpoints/**/*.ckpt"))


def test_a_run_directory_in_use_is_refused_before_training(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                           monkeypatch):
    """Two fits in one run directory (a fixed logger version, or the stopped run the default version resumes):
    while the first holds it, the second is refused with one line before its first step."""
    from ralm.lock import claim
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "checkpoints" / "reranker" / "mine"
    with claim(run_dir, "--trainer.logger.init_args.version"):
        assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--trainer.logger.init_args.version", "mine")) == 2
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(run_dir) in errors[0] and "in use by pid" in errors[0], err
    fit = main(fit_args(tiny_roberta_dir, rerank_data_dir, 4, "--trainer.logger.init_args.version", "mine"))
    assert fit.trainer.global_step == 4 and not (run_dir / ".lock").exists()  # free again: it trains


def test_an_export_dir_holding_another_fits_export_is_refused(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                               monkeypatch):
    """--export_dir over another fit's finished export: one line before training, the export left as it was; the
    same fit (its run directory) exporting there again is allowed."""
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    export = tmp_path / "export"
    version = ["--trainer.logger.init_args.version", "a"]
    assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 0, "--export_dir", str(export), *version)) != 2
    before = (export / "reranker.json").read_bytes()
    assert json.loads(before)["trained"]["run"] and str(tmp_path) not in before.decode()  # an id, not a path
    capsys.readouterr()
    assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 0, "--export_dir", str(export),
                         "--trainer.logger.init_args.version", "b")) == 2
    err = capsys.readouterr().err
    assert "holds the export of another fit" in err and err.count("error:") == 1, err
    assert (export / "reranker.json").read_bytes() == before
    assert main(fit_args(tiny_roberta_dir, rerank_data_dir, 0, "--export_dir", str(export), *version)) != 2


def test_bi_encoder_fits_exports_and_scores_as_trained(tmp_path, tiny_bert_dir, rerank_data_dir, monkeypatch):
    """--model.architecture bi end to end: trains, its export and checkpoint load to a BiEncoder with the
    best checkpoint's weights, and the selector scores pairs exactly as the training module does."""
    from ralm.loading import load_tokenizer
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import load_reranker
    from reranking.fit import main
    from reranking.model import BiEncoder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["reranking.fit"])
    cli = main(fit_args(tiny_bert_dir, rerank_data_dir, 8, "--model.architecture", "bi",
                        "--model.input.max_passage_tokens", "40", "--model.cosine_temperature", "0.1"))
    run = tmp_path / cli.trainer.log_dir
    assert cli.trainer.global_step == 8 and "val/nll_reranker" in scalars(run)
    best = next(p for p in (run / "checkpoints").iterdir() if p.name.startswith("best-"))
    m1, tok, fmt = load_reranker(run / "reranker")
    m2, _, fmt2 = load_reranker(best)
    assert isinstance(m1, BiEncoder) and isinstance(m2, BiEncoder) and m1.temperature == m2.temperature == 0.1
    assert fmt == fmt2 and (fmt.architecture, fmt.max_prefix_tokens, fmt.max_passage_tokens) == ("bi", 32, 40)
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    untrained = BiEncoder(str(tiny_bert_dir), pretrained=False)
    assert not all(torch.equal(a, b) for a, b in zip(untrained.state_dict().values(), m1.state_dict().values()))
    cands = [[Passage(f"d{i}{j}", f"Title {j}", f"text {i} {j} " * (j + 1), 0.0) for j in range(n)]
             for i, n in enumerate([3, 0, 5])]
    batch = StrideBatch(prefix_texts=["the city was", "a river", "the album of the year"], candidates=cands,
                        stride_ids=[1, 2, 3])
    got = PredictiveSelector.from_path(run / "reranker", batch_size=2).scores(batch)
    system = cli.model.eval()
    with torch.no_grad():
        for i, c in enumerate(cands):
            if not c:
                continue
            enc = fmt.encode(load_tokenizer(str(tiny_bert_dir)), [batch.prefix_texts[i]], [p.document() for p in c],
                             [0] * len(c))
            want = system.model(**enc)
            torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-5)


def test_a_log_file_shows_progress_and_the_resolved_precision(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                              monkeypatch):
    """stderr not a terminal (a log file): step lines with rate and ETA, the validation metrics, the precision
    that ``auto`` resolved to (printed, and recorded in the export)."""
    from ralm.precision import lightning_precision
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["reranking.fit"])
    cli = main(fit_args(tiny_roberta_dir, rerank_data_dir, 4))
    err = capsys.readouterr().err
    expected = lightning_precision("auto", "cpu")[0]
    assert f"[reranking.fit] precision {expected}: " in err, err
    assert "[fit] 4/4 steps (100.0%)" in err and "ETA" in err, err
    assert "[fit] step 4 validation: " in err and "val/nll_reranker" in err, err
    meta = json.loads((tmp_path / cli.trainer.log_dir / "reranker" / "reranker.json").read_text())
    t = meta["trained"]
    assert (t["precision"], t["steps"], t["fit_steps"], t["loss"]) == (expected, 4, 4, "marginal")
    assert t["data"] == rerank_data_dir.name and "val/nll_reranker" in t["validation"]
    shared = json.dumps(meta) + (tmp_path / cli.trainer.log_dir / "reranker" / "README.md").read_text()
    assert str(tmp_path) not in shared and str(tiny_roberta_dir) not in shared  # no machine path in what is shared


def test_a_killed_or_stopped_fit_reruns_to_the_weights_of_an_unbroken_one(tmp_path, tiny_roberta_dir, rerank_data_dir):
    """``python -m reranking.fit`` SIGKILLed, another one SIGTERMed and a third Ctrl-C'd (SIGINT to its process
    group) as soon as its first ``last.ckpt`` is on disk (step 4 of 40); then the same command again: each resumes
    in the same run directory and ends with exactly the weights of a run that was never interrupted. The
    SIGTERMed and Ctrl-C'd ones first save ``last.ckpt`` at the step they are on, say so in one line and exit 143
    / 130 (not 0: a scheduler must not take it for a finished fit)."""
    import signal
    import time

    from reranking.fit import main

    args = fit_args(tiny_roberta_dir, rerank_data_dir, 40, "--trainer.logger.init_args.version", "run")
    cmd = [sys.executable, "-m", "reranking.fit", *args]
    resumed = {}
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        killed = tmp_path / sig.name
        killed.mkdir()
        log = killed / "fit.log"
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, cwd=killed, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            last = None
            while p.poll() is None and last is None:
                found = glob.glob(str(killed / "**" / "checkpoints" / "last.ckpt"), recursive=True)
                last = Path(found[0]) if found else None
                time.sleep(0.02)
            first = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
            os.killpg(p.pid, sig)
            rc = p.wait()
        kept = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
        if sig == signal.SIGKILL:
            assert rc == -signal.SIGKILL, log.read_text()  # killed mid-run, not finished before the kill
        else:
            assert rc == (143 if sig == signal.SIGTERM else 130), log.read_text()[-3000:]
            said = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C (SIGINT)"
            assert f"stopped by {said} at step {kept}; kept {last.resolve()} (step {kept})" in log.read_text()
            assert not (killed / "run" / "reranker").exists() and not glob.glob(str(killed / "**" / "reranker.json"),
                                                                                  recursive=True)
        assert 0 < first <= kept < 40, (sig, first, kept)
        rerun = subprocess.run(cmd, cwd=killed, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert f"resuming from {last.resolve()}" in rerun.stderr, rerun.stderr[-3000:]
        resumed[sig] = torch.load(last, map_location="cpu", weights_only=True)
    straight = tmp_path / "straight"
    straight.mkdir()
    old_cwd, old_argv = os.getcwd(), sys.argv
    sys.argv = ["reranking.fit"]
    try:
        os.chdir(straight)
        assert main(args).trainer.global_step == 40
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    b = torch.load(next(straight.glob("**/checkpoints/last.ckpt")), map_location="cpu", weights_only=True)
    for sig, a in resumed.items():
        assert a["global_step"] == b["global_step"] == 40, sig
        for k in b["state_dict"]:
            assert torch.equal(a["state_dict"][k], b["state_dict"][k]), (sig, k)


def test_zero_steps_export_the_untrained_start_as_such(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                       monkeypatch):
    """``--trainer.max_steps 0``: the start's weights exported, recorded as 0 steps and printed as untrained."""
    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["reranking.fit"])
    main(fit_args(tiny_roberta_dir, rerank_data_dir, 0, "--export_dir", str(tmp_path / "start")))
    assert "exported the untrained start (0 steps)" in capsys.readouterr().err
    assert json.loads((tmp_path / "start" / "reranker.json").read_text())["trained"]["fit_steps"] == 0


def test_a_truncated_or_foreign_shard_is_one_line_naming_it(tmp_path, tiny_roberta_dir, rerank_data_dir, capsys,
                                                              monkeypatch):
    """A shard cut short (a copy that stopped), one whose pages are damaged (random bytes inside, the footer
    intact), or a parquet file of another schema, among the training data: exit 2, one line naming that shard and
    the fix, before anything trains."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from reranking.fit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["reranking.fit"])
    for bad, said in (("truncated", "is not a readable parquet shard"), ("damaged", "its bytes are damaged"),
                      ("foreign", "lacks the columns")):
        data = tmp_path / bad
        shutil.copytree(rerank_data_dir, data)
        shard = sorted(data.glob("*.parquet"))[-1]
        if bad == "truncated":
            shard.write_bytes(shard.read_bytes()[:-200])
        elif bad == "damaged":
            raw = bytearray(shard.read_bytes())
            raw[200:1200] = bytes(np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8))
            shard.write_bytes(bytes(raw))
        else:
            pq.write_table(pa.table({"id": [1], "text": ["x"]}), shard)
        assert main(fit_args(tiny_roberta_dir, data, 4)) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and said in lines[0] and shard.name in lines[0] and "Traceback" not in err, err


def test_a_stopped_fit_with_the_default_version_continues_in_its_own_version(tmp_path, tiny_roberta_dir,
                                                                           rerank_data_dir):
    """Without --trainer.logger.init_args.version Lightning starts a new version_N a run: a fit stopped by
    SIGTERM, rerun with the same command, continues in version_0 from its last.ckpt (not version_1 from step 0);
    another command (other settings) is a new run."""
    import signal
    import time

    cmd = [sys.executable, "-m", "reranking.fit", *fit_args(tiny_roberta_dir, rerank_data_dir, 40)]
    runs = tmp_path / "checkpoints" / "reranker"
    with open(tmp_path / "fit.log", "wb") as out:
        p = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while p.poll() is None and not glob.glob(str(runs / "version_0" / "checkpoints" / "last.ckpt")):
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGTERM)
        assert p.wait() == 143, (tmp_path / "fit.log").read_text()[-2000:]
    last = runs / "version_0" / "checkpoints" / "last.ckpt"
    rerun = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {last.resolve()}" in rerun.stderr and not (runs / "version_1").exists()
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 40
    other = subprocess.run([*cmd, "--trainer.max_steps", "8", "--model.optimizer.total_steps", "8"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert other.returncode == 0 and "resuming" not in other.stderr and (runs / "version_1").is_dir(), other.stderr[-2000:]
