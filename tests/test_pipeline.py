"""The whole chain on tiny real components: data_gen.build → reranking.fit → eval.ppl --reranker <export>."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
L, S, DOC = 64, 4, 20


def run(module: str, *args: str, cwd: Path = ROOT) -> None:
    """``python -m MODULE ARGS`` in this process, as ``demo.run`` runs its stages (``ralm.cli.run_module``; the
    processes' own start-up, kill and resume are tested in test_data_gen / test_reranking_fit)."""
    from ralm.cli import run_module

    rc = run_module(module, list(args), cwd=cwd)
    assert rc == 0, f"{module} exited with {rc}"


@pytest.fixture(scope="module")
def chain(tmp_path_factory, bm25_corpus, tiny_gpt2_dir, tiny_roberta_dir):
    d = tmp_path_factory.mktemp("chain")
    train = d / "train.txt"
    train.write_text(bm25_corpus["text"], encoding="utf-8")
    run("data_gen.build", "--text.file", str(train), "--retrieval.index", str(bm25_corpus["index"]), "--model",
        str(tiny_gpt2_dir), "--windows.max_length", str(L), "--windows.doc_max_tokens", str(DOC),
        "--windows.stride", str(S), "--retrieval.k", "4", "--examples", "32", "--shard_size", "16",
        "--eval_text.dataset", "null", "--out", str(d / "data"), "--batch_examples", "4",
        "--trainer.accelerator", "cpu", "--trainer.devices", "1")
    run("reranking.fit", "--config", str(ROOT / "configs" / "fit.yaml"), "--model.encoder", str(tiny_roberta_dir),
        "--model.input.max_length", "64", "--model.input.max_prefix_tokens", "24", "--model.optimizer.warmup_steps", "1",
        "--data.data_dir", str(d / "data"), "--data.val_fraction", "0.25", "--data.batch_size", "4",
        "--data.max_candidates", "4", "--data.num_workers", "0", "--trainer.max_steps", "4",
        "--trainer.accumulate_grad_batches", "1", "--trainer.val_check_interval", "2",
        "--trainer.log_every_n_steps", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
        "--export_dir", str(d / "export"), cwd=d)
    return d


def test_training_prefix_is_what_the_eval_loop_shows_the_reranker(chain, bm25_corpus, tiny_gpt2_dir):
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    ids = tok(bm25_corpus["text"], add_special_tokens=False)["input_ids"]
    rows = datasets.load_dataset("parquet", data_files=str(chain / "data" / "*.parquet"), split="train")
    for r in rows.select(range(5)):
        p = r["position"]
        # eval/loop.py decodes the window tokens before the targets: ids[end - L : end - s].
        assert r["prefix_text"] == tok.decode(ids[p - (L - S):p])
        assert r["target_ids"] == ids[p:p + S]


def test_eval_with_the_trained_reranker(chain, tiny_gpt2_dir, bm25_corpus):
    from eval.ppl import main

    text = chain / "eval.txt"
    body = bm25_corpus["text"]
    text.write_text(body[body.index(" = ", 5000):][:1200], encoding="utf-8")
    # the export holds the best checkpoint's weights: evaluating either must give the same run
    bests = list((chain / "checkpoints").rglob("best-*.ckpt"))
    assert len(bests) == 1, bests
    ckpt = bests[0]
    assert (chain / "export" / "model.safetensors").exists()
    events = list((chain / "checkpoints").rglob("events.out.tfevents.*"))
    assert events
    results = {}
    for name, reranker in (("export", chain / "export"), ("ckpt", ckpt)):
        out = chain / f"ppl-{name}"
        assert main(["--model", str(tiny_gpt2_dir), "--text.file", str(text),
                     "--retrieval.index", str(bm25_corpus["index"]), "--reranker", str(reranker),
                     "--windows.stride", str(S), "--windows.max_length", str(L), "--windows.doc_max_tokens", str(DOC),
                     "--retrieval.k", "4", "--output_dir", str(out), "--trainer.accelerator", "cpu"]) == 0
        results[name] = json.loads((out / "results.json").read_text())
        assert results[name]["strides_with_document"] > 0 and np.isfinite(results[name]["ppl_word"])
        assert sum(results[name]["chosen_rank_counts"].values()) == results[name]["strides_with_document"]
    export, from_ckpt = results["export"], results["ckpt"]
    assert export["chosen_rank_counts"] == from_ckpt["chosen_rank_counts"]
    assert export["ppl_word"] == pytest.approx(from_ckpt["ppl_word"], rel=1e-9)
    assert export["ppl_token"] == pytest.approx(from_ckpt["ppl_token"], rel=1e-9)
    chosen = [pd.read_parquet(chain / f"ppl-{n}" / "strides.parquet") for n in ("export", "ckpt")]
    assert chosen[0].equals(chosen[1])
