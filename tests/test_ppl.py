"""``python -m eval.ppl`` end to end on a real Lucene index and a tiny local GPT-2: results, resume after a
kill, refusals that protect earlier work, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eval.ppl import main
from ralm.retrieval import read_reference_json
from ralm.tiny import make_gpt2, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--windows.stride", "4", "--windows.max_length", "48", "--windows.doc_max_tokens", "20",
         "--windows.zero_shot_tokens", "8", "--retrieval.k", "4", "--scoring.batch_size", "8",
         "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--progress", "false",
         "--scoring.dtype", "float32"]  # compared with float32 transcriptions (auto is bf16 on some CPUs)


@pytest.fixture(scope="module")
def eval_text(tmp_path_factory, bm25_corpus):
    """An evaluation text: two corpus articles (so some retrieved titles are forbidden) + new text."""
    text = bm25_corpus["text"]
    start = text.index(" = ", 10)
    part = text[start:start + 1500]
    p = tmp_path_factory.mktemp("evaltext") / "eval.txt"
    p.write_text(part, encoding="utf-8")
    return p


def run(tmp_path, name, *args):
    out = tmp_path / name
    assert main([*args, "--output_dir", str(out)]) == 0
    return json.loads((out / "results.json").read_text()), out


def test_index_run_then_reference_file_gives_the_same_numbers(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL]
    ref = tmp_path / "retrieval.json"
    for reranker in ("bm25", "zero-shot", "oracle"):
        a, out = run(tmp_path, f"idx-{reranker}", *common, "--retrieval.index", str(bm25_corpus["index"]),
                     "--reranker", reranker, "--save_retrieval_file", str(ref))
        b, _ = run(tmp_path, f"file-{reranker}", *common, "--retrieval_file", str(ref), "--reranker", reranker)
        assert a["ppl_word"] == pytest.approx(b["ppl_word"], rel=1e-9)
        assert a["n_scored_tokens"] == b["n_scored_tokens"] == a["n_tokens"] - 1
        assert a["n_words"] == eval_text.read_text().count(" ")
        assert a["strides_with_document"] > 0
    none, _ = run(tmp_path, "none", *common, "--reranker", "none")
    assert none["strides_with_document"] == 0
    entries = read_reference_json(ref)
    assert entries[1]["begin_location"] == 48 and entries[1]["end_location"] == 52
    # Forbidden titles (the eval text's own headings) never come back.
    heading = eval_text.read_text().split(" = ")[1]
    assert all(not d["text"].startswith(heading + "\n") for e in entries for d in e["retrieved_docs"])
    # Outputs describe themselves and are readable without pickle; the work directory is gone.
    toks = np.load(out / "tokens.npz", allow_pickle=False)
    assert toks["nll"].shape == (a["n_scored_tokens"],)
    assert (out / "results.md").read_text().startswith("| metric |")
    assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG" and not (out / "work").exists()
    assert a["retrieval"]["k1"] == 0.9 and a["retrieval"]["b"] == 0.4
    import pyarrow.parquet as pq

    strides = pq.read_table(out / "strides.parquet").to_pylist()
    chosen = [s for s in strides if s["chosen_rank"] >= 0]
    assert chosen and all(s["chosen_title"] and s["chosen_text"] for s in chosen)


def test_compare_prints_one_table_and_a_plot(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text, capsys):
    from eval.compare import main as compare

    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
              "--retrieval.index", str(bm25_corpus["index"])]
    dirs = [str(run(tmp_path, r, *common, "--reranker", r)[1]) for r in ("none", "bm25", "oracle")]
    capsys.readouterr()
    assert compare(dirs) == 0
    table = capsys.readouterr().out
    assert table.count("\n|") >= 4 and "vs none" in table and "vs bm25" in table and "oracle" in table
    assert (tmp_path / "comparison.png").is_file() and (tmp_path / "comparison.md").is_file()
    assert compare([dirs[0], str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert compare(dirs + ["--baseline", dirs[1], "--out", str(tmp_path / "by-path")]) == 0  # a path names its run
    assert (tmp_path / "by-path" / "comparison.md").read_text() == (tmp_path / "comparison.md").read_text()
    assert compare(dirs + ["--baseline", "bm52"]) == 2
    assert "--baseline 'bm52' is none of the runs given" in capsys.readouterr().err


def test_reusing_an_earlier_runs_scores_gives_that_runs_numbers(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text,
                                                               capsys):
    """--reuse_from: the random reranker agrees with bm25 on some strides; those take bm25's token NLLs, the
    rest are scored, and the whole equals a run that scored every stride."""
    import pyarrow.parquet as pq

    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
              "--retrieval.index", str(bm25_corpus["index"])]
    _, bm25 = run(tmp_path, "bm25", *common, "--reranker", "bm25")
    full, full_dir = run(tmp_path, "random", *common, "--reranker", "random", "--seed", "3")
    reused, reused_dir = run(tmp_path, "random-reusing", *common, "--reranker", "random", "--seed", "3",
                             "--reuse_from", str(bm25), "--chunk_strides", "5")
    table = {name: pq.read_table(d / "strides.parquet").to_pydict() for name, d in
             (("bm25", bm25), ("full", full_dir), ("reused", reused_dir))}
    same = [i > 0 and a == b for i, (a, b) in
            enumerate(zip(table["bm25"]["chosen_docid"], table["full"]["chosen_docid"]))]
    assert 0 < sum(same) < len(same) - 1  # a real mix of reused and scored strides
    assert table["reused"]["reused"] == same and reused["strides_reused"] == sum(same)
    assert table["reused"]["chosen_docid"] == table["full"]["chosen_docid"]
    # Reused strides carry bm25's numbers exactly; scored ones equal the full run's.
    for i, was_reused in enumerate(same):
        want = table["bm25"]["nll"][i] if was_reused else table["full"]["nll"][i]
        assert table["reused"]["nll"][i] == pytest.approx(want, rel=1e-5)
    assert reused["ppl_word"] == pytest.approx(full["ppl_word"], rel=1e-5)
    assert full["strides_reused"] == 0 and reused["seconds_per_1000_strides"] is None
    assert reused["reused_from"] == [str(bm25)]
    # A run on other windows cannot lend its scores.
    capsys.readouterr()
    other = [a if a != "48" else "40" for a in common]
    assert main([*other, "--reranker", "random", "--reuse_from", str(bm25), "--output_dir",
                 str(tmp_path / "bad")]) == 2
    assert "differs from this one in windows" in capsys.readouterr().err


def test_the_abstaining_oracle_takes_the_oracles_and_nones_scores(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    """oracle-abstain keeps the window without a passage where no candidate does better: per stride the smaller
    of none's and the oracle's NLL (none on ties), so never worse than either; reusing the oracle and none runs
    it forwards nothing after the first window and equals the run that scored everything itself."""
    import pyarrow.parquet as pq

    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
              "--retrieval.index", str(bm25_corpus["index"])]
    none, none_dir = run(tmp_path, "none", *common, "--reranker", "none")
    oracle, oracle_dir = run(tmp_path, "oracle", *common, "--reranker", "oracle")
    full, full_dir = run(tmp_path, "oracle-abstain", *common, "--reranker", "oracle-abstain")
    lent, lent_dir = run(tmp_path, "oracle-abstain-reusing", *common, "--reranker", "oracle-abstain",
                         "--reuse_from", f"[{oracle_dir},{none_dir}]")
    t = {d.name: pq.read_table(d / "strides.parquet").to_pydict() for d in (none_dir, oracle_dir, full_dir, lent_dir)}
    n = full["n_strides"]
    assert lent["strides_reused"] == n - 1 and t["oracle-abstain-reusing"]["nll"] == pytest.approx(
        t["oracle-abstain"]["nll"], rel=1e-5)
    best = np.minimum(t["none"]["nll"], t["oracle"]["nll"])
    assert t["oracle-abstain"]["nll"] == pytest.approx(best, rel=1e-5)
    kept = [s for s in range(1, n) if t["oracle-abstain"]["chosen_rank"][s] == -1 and t["oracle"]["n_candidates"][s]]
    assert kept and all(t["none"]["nll"][s] <= t["oracle"]["nll"][s] for s in kept)
    assert none["ppl_word"] >= full["ppl_word"] and oracle["ppl_word"] >= full["ppl_word"]
    from eval.compare import load_run, table  # the comparison says how often each row took no passage

    md = table([load_run(d) for d in (none_dir, oracle_dir, full_dir)], "none")
    has = np.array(t["oracle"]["n_candidates"]) > 0
    share = (np.array(t["oracle-abstain"]["chosen_rank"])[has] < 0).mean()
    row = next(line for line in md.splitlines() if line.startswith("| oracle-abstain |"))
    assert "no passage chosen" in md and f"| {100 * share:.0f}% |" in row


def test_an_lm_choosing_run_lends_every_candidates_scores(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text, capsys):
    """Zero-shot and oracle keep every candidate's target NLLs (candidates.npz): an oracle reusing the
    zero-shot run, and a random reranker reusing the oracle run, forward no stride after the first and equal
    runs that scored every stride."""
    import pyarrow.parquet as pq

    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
              "--retrieval.index", str(bm25_corpus["index"])]
    _, zs = run(tmp_path, "zero-shot", *common, "--reranker", "zero-shot")
    full, full_dir = run(tmp_path, "oracle", *common, "--reranker", "oracle")
    lent, lent_dir = run(tmp_path, "oracle-reusing", *common, "--reranker", "oracle", "--reuse_from", str(zs),
                         "--chunk_strides", "5")
    rand, rand_dir = run(tmp_path, "random", *common, "--reranker", "random", "--seed", "3")
    rand_lent, rand_lent_dir = run(tmp_path, "random-reusing", *common, "--reranker", "random", "--seed", "3",
                                   "--reuse_from", str(lent_dir))
    table = {d.name: pq.read_table(d / "strides.parquet").to_pydict()
             for d in (full_dir, lent_dir, rand_dir, rand_lent_dir)}
    n = full["n_strides"]
    for a, b, res in (("oracle", "oracle-reusing", lent), ("random", "random-reusing", rand_lent)):
        assert table[b]["reused"] == [i > 0 for i in range(n)] and res["strides_reused"] == n - 1
        assert table[b]["chosen_docid"] == table[a]["chosen_docid"]
        assert table[b]["nll"] == pytest.approx(table[a]["nll"], rel=1e-5)
        assert res["seconds_per_1000_strides"] is None
    assert lent["ppl_word"] == pytest.approx(full["ppl_word"], rel=1e-5)
    assert rand_lent["ppl_word"] == pytest.approx(rand["ppl_word"], rel=1e-5)
    assert len({*table["random"]["chosen_docid"]} - {*table["oracle"]["chosen_docid"]}) > 0  # not the same picks
    # The table itself: per stride, its candidates in BM25 rank order, the oracle's pick the first minimum.
    z = np.load(full_dir / "candidates.npz", allow_pickle=False)
    docids = json.loads(z["docid"].tobytes().decode())
    sums = np.add.reduceat(z["nll"].astype(np.float64), np.r_[0, np.cumsum(z["n_tokens"])[:-1]])
    for s in range(1, n):
        rows = np.flatnonzero(z["stride"] == s)
        assert len(rows) == max(1, table["oracle"]["n_candidates"][s])
        pick = table["oracle"]["chosen_rank"][s]
        assert docids[rows[max(pick, 0)]] == table["oracle"]["chosen_docid"][s]
        assert pick == (int(np.argmin(sums[rows])) if table["oracle"]["n_candidates"][s] else -1)
        assert sums[rows[max(pick, 0)]] == pytest.approx(table["oracle"]["nll"][s], rel=1e-6)
    assert not (rand_dir / "candidates.npz").exists()
    capsys.readouterr()
    assert main([*common, "--reranker", "zero-shot", "--reuse_from", str(full_dir), "--output_dir",
                 str(tmp_path / "bad")]) == 2
    assert "nothing to reuse" in capsys.readouterr().err


def test_zero_shot_with_a_separate_lm_of_another_vocabulary(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    other = tmp_path / "other_lm"
    tok = train_tokenizer([bm25_corpus["text"][:20000]], other, vocab_size=300)
    make_gpt2(other, tok, n_layer=1, n_embd=16, n_head=2, seed=3)
    res, _ = run(tmp_path, "zs-other", "--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
                 "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "zero-shot", "--ranker.model", str(other))
    assert res["strides_with_document"] > 0 and np.isfinite(res["ppl_word"])


def test_an_lm_placed_by_device_map_scores_as_on_one_device(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    """--scoring.device_map, the path of an LM larger than one device: here its second block is streamed
    from disk and the rest sits on CPU (Accelerate's hooks, as across GPUs). Same token NLL and choices as
    the plain load; Lightning must not gather the model onto one device; several devices are refused."""
    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
              "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "zero-shot"]
    plain, a = run(tmp_path, "plain", *common)
    placement = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "cpu",
                 "transformer.h.1": "disk", "transformer.ln_f": "cpu", "lm_head": "cpu"}
    placed, b = run(tmp_path, "placed", *common, "--scoring.device_map", json.dumps(placement))
    from ralm.loading import load_causal_lm

    lm, _ = load_causal_lm(str(tiny_gpt2_dir), device_map=placement, offload_folder=str(tmp_path / "offload"))
    assert lm.transformer.h[1].mlp.c_fc.weight.device.type == "meta"  # read from disk at every forward
    ta, tb = np.load(a / "tokens.npz"), np.load(b / "tokens.npz")
    assert np.array_equal(ta["token_id"], tb["token_id"]) and np.allclose(ta["nll"], tb["nll"], rtol=1e-5, atol=1e-5)
    assert placed["chosen_rank_counts"] == plain["chosen_rank_counts"]
    assert placed["ppl_word"] == pytest.approx(plain["ppl_word"], rel=1e-5)
    assert main([*common, "--scoring.device_map", "auto", "--trainer.devices", "2", "--output_dir",
                 str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()  # refused before any work


def _cli(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "eval.ppl", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_killed_run_resumes_to_bit_identical_results(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text, sig):
    """SIGKILL, or Ctrl-C (SIGINT to the process group: status 130 and one line, the retrieval child stopped with
    it), mid-run; the same command resumes to the unbroken run's numbers, token for token."""
    args = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL, "--chunk_strides", "4",
            "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "oracle"]
    whole, _ = run(tmp_path, "whole", *args)
    out = tmp_path / "killed"
    p = _cli([*args, "--output_dir", str(out)])
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and len(list((out / "work" / "chunks").glob("chunk-*.npz"))) < 3:
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before it could be killed:\n" + p.communicate()[0]
    os.killpg(p.pid, getattr(signal, sig))
    said = p.communicate(timeout=60)[0]
    if sig == "SIGINT":
        assert p.returncode == 130 and "stopped by Ctrl-C (SIGINT)" in said and "Traceback" not in said, said
    assert not (out / "results.json").exists()  # nothing that looks complete
    rerun = _cli([*args, "--output_dir", str(out)])
    log, _ = rerun.communicate(timeout=180)
    assert rerun.returncode == 0, log
    again = json.loads((out / "results.json").read_text())
    assert again["ppl_word"] == whole["ppl_word"] and again["nll_sum"] == whole["nll_sum"]
    a = np.load(tmp_path / "whole" / "tokens.npz")["nll"]
    b = np.load(out / "tokens.npz")["nll"]
    assert np.array_equal(a, b)


def test_a_second_run_on_the_same_directory_is_refused_at_once(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text,
                                                                 paused):
    """Two evaluations started on one --output_dir (a rerun in a second terminal): the second is refused
    with one line naming the directory and the first process, and the first finishes untouched."""
    args = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL, "--chunk_strides", "4",
            "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "oracle", "--output_dir", str(tmp_path / "o")]
    first = _cli(args)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None and not list((tmp_path / "o" / "work" / "chunks").glob("*.npz")):
        time.sleep(0.02)
    with paused(first):  # lock held: no race with the second's start-up
        assert first.poll() is None, "the first run ended before the second started:\n" + first.communicate()[0]
        second = _cli(args)
        log2, _ = second.communicate(timeout=120)
    log1, _ = first.communicate(timeout=180)
    assert first.returncode == 0, log1
    assert second.returncode == 2, log2
    err = log2.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "o") in err[0] and f"pid {first.pid} " in err[0], log2
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["n_strides"] > 0 and not (tmp_path / "o" / "work").exists()


def test_other_runs_are_never_overwritten_and_reruns_are_noops(tmp_path, tiny_gpt2_dir, eval_text, capsys):
    args = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL, "--reranker", "none"]
    res, out = run(tmp_path, "none", *args)
    stamp = (out / "results.json").stat().st_mtime_ns
    assert main([*args, "--output_dir", str(out)]) == 0  # the same evaluation: nothing to do
    assert (out / "results.json").stat().st_mtime_ns == stamp
    assert main([*args, "--windows.stride", "8", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds results of another evaluation" in err and "windows" in err
    (out / "tokens.npz").write_bytes(b"truncated")  # a damaged output never passes as complete
    from eval.results import read_complete

    assert read_complete(out) is None


def test_bad_inputs_fail_with_one_line(tmp_path, tiny_gpt2_dir, tiny_roberta_dir, bm25_corpus, eval_text, capsys,
                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --output_dir is relative
    idx = ["--retrieval.index", str(bm25_corpus["index"])]

    def fails(*args, match):
        assert main(["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL, *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and match in err, err
        return err

    short = tmp_path / "short.txt"
    short.write_text(" = A = \n a few words only . \n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    e1 = fails("--windows.doc_max_tokens", "48", *idx, match="--windows.doc_max_tokens (48) must be < L - s")
    fails("--text.file", str(short), *idx, match="fit in one 48-token window")
    fails("--retrieval.k", "100000", *idx, match="larger than the corpus")
    fails("--reranker", "zero-shot", "--windows.zero_shot_tokens", "200", *idx, match="too short to rank on 200")
    fails("--retrieval.query_tokens", "100", *idx, match="--retrieval.query_tokens (100) must be <= L - s")
    fails("--reranker", "bm25", "--retrieval.index", "null", match="needs candidates")
    fails("--reranker", "nope", *idx, match="no such file or directory")
    garbage = tmp_path / "bad.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    fails("--reranker", str(garbage), *idx, match="not a readable checkpoint")
    fails("--reranker", str(tiny_roberta_dir), *idx, match="not a reranker export")
    fails("--reranker", "cosine", *idx, match="--ranker.model")
    fails("--retrieval.index", str(tmp_path / "no-index"), match="no-index")
    fails("--text.file", str(tmp_path / "missing.txt"), *idx, match="missing.txt")
    fails("--model", str(tiny_roberta_dir), *idx, match="is not a causal language model")
    fails("--model", str(tmp_path / "no-model"), *idx, match="no-model")
    if os.geteuid() != 0:  # root writes anywhere
        fails("--output_dir", str(ro / "out"), *idx, match="not writable")
    fails("--windows.strid", "3", match="strid")
    # the same bad setting gets the same message from data generation
    from data_gen.build import main as build_main

    assert build_main(["--model", str(tiny_gpt2_dir), "--windows.max_length", "48", "--windows.doc_max_tokens", "48",
                       "--out", str(tmp_path / "d")]) == 2
    e2 = capsys.readouterr().err
    assert e1.split("error: ", 1)[1] == e2.split("error: ", 1)[1]


def test_help_and_print_config():
    """The description as written (each example command on its own line); --print_config resolves a YAML."""
    p = subprocess.run([sys.executable, "-m", "eval.ppl", "--help"], cwd=ROOT, capture_output=True, text=True)
    lines = p.stdout.splitlines()
    assert "    python -m eval.ppl --reranker bm25          # paper settings: GPT-2, WikiText-103 test, BM25 over DPR" in lines
    assert any(line.startswith("    python -m eval.ppl --config configs/ppl.yaml --reranker zero-shot") for line in lines)
    p = subprocess.run([sys.executable, "-m", "eval.ppl", "--config", str(ROOT / "configs" / "ppl.yaml"),
                        "--print_config"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0 and "windows:" in p.stdout and "stride: 4" in p.stdout


def test_retrieve_cli_writes_what_eval_ppl_reads(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    from eval.retrieval_file import main as retrieve_main

    out = tmp_path / "r.json"
    assert retrieve_main(["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), "--retrieval.index",
                          str(bm25_corpus["index"]), "--output", str(out), "--windows.stride", "4",
                          "--windows.max_length", "48", "--windows.doc_max_tokens", "48",  # unused: no document placed
                          "--retrieval.k", "4"]) == 0
    entries = read_reference_json(out)
    assert entries[0]["retrieved_docs"] == [] and all(len(e["retrieved_docs"]) == 4 for e in entries[1:])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    ids = tok(eval_text.read_text(), add_special_tokens=False)["input_ids"]
    e = entries[5]  # the query is the decoded 32 tokens just before the targets: only the past
    assert e["query"] == tok.decode(ids[e["begin_location"] - 32:e["begin_location"]])
    res, _ = run(tmp_path, "from-retrieve", "--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL,
                 "--retrieval_file", str(out), "--reranker", "bm25")
    assert res["strides_with_document"] == len(entries) - 1


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    """eval.ppl on 2 CPU processes (gloo DDP): same perplexity, per-token NLL and chosen passages as 1."""
    import pyarrow.parquet as pq

    common = ["--model", str(tiny_gpt2_dir), "--text.file", str(eval_text), *SMALL, "--chunk_strides", "16",
              "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "zero-shot"]
    one, out1 = run(tmp_path, "one", *common)
    args = common + ["--output_dir", str(tmp_path / "two")]
    args[args.index("--trainer.devices") + 1] = "2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "eval.ppl", *args, "--trainer.strategy", "ddp"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two["ppl_word"] == one["ppl_word"] and two["n_scored_tokens"] == one["n_scored_tokens"]
    np.testing.assert_array_equal(np.load(tmp_path / "two" / "tokens.npz")["nll"], np.load(out1 / "tokens.npz")["nll"])
    cols = ["stride", "chosen_rank", "chosen_title"]
    assert pq.read_table(tmp_path / "two" / "strides.parquet", columns=cols).to_pylist() == \
        pq.read_table(out1 / "strides.parquet", columns=cols).to_pylist()
    assert one["n_strides"] > 32  # several chunks, so both processes had work


def test_shipped_ppl_configs_parse():
    """Every shipped ppl*.yaml goes through eval.ppl's own parser (the demo's and the real-text recipe's
    were otherwise read only by the slow demo test or by hand), and the paper's settings stay the paper's."""
    from eval.ppl import ppl
    from ralm.cli import parse

    files = sorted((ROOT / "configs").rglob("ppl*.yaml"))
    assert {f.relative_to(ROOT).as_posix() for f in files} >= {"configs/ppl.yaml", "configs/demo/ppl.yaml",
                                                                "configs/wikitext2/ppl.yaml"}
    for f in files:
        kw = parse(ppl, ["--config", str(f)], "eval.ppl")
        assert kw["model"] and kw["windows"].stride > 0 and kw["retrieval"].k > 0, f
        assert kw["trainer"].kwargs(), f
    kw = parse(ppl, ["--config", str(ROOT / "configs" / "ppl.yaml")], "eval.ppl")
    r, w = kw["retrieval"], kw["windows"]
    assert (kw["model"], r.index, r.k, r.query_tokens, w.stride, w.max_length, w.doc_max_tokens) == (
        "gpt2", "wikipedia-dpr-100w", 16, 32, 4, 1024, 256)
    assert kw["text"].name == "wikitext-103-v1" and kw["text"].split == "test" and r.forbid_eval_titles


def test_each_stride_is_assigned_the_article_it_scores(tiny_gpt2_dir):
    """The resampling units of ``eval.compare``: per stride, the article holding its first scored token,
    by a plain count of the headings before that character (a word-less lead before the first heading,
    as raw WikiText opens with, belongs to the first article instead of being a unit of one stride)."""
    from transformers import AutoTokenizer

    from eval.perplexity import stride_articles
    from ralm.windows import stride_windows

    body = "".join(f" \n = Title {t} = \n \n" + f" word{t} and more text {t} here .\n" * 5 for t in "ABC")
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    offsets = tok(body, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    wins = stride_windows(len(offsets), stride=4, max_length=16)
    got = stride_articles(tok, body, wins, range(len(wins)))
    headings = [body.index(f" = Title {t} = ") for t in "ABC"]
    want = [max(0, sum(h <= offsets[w.target_begin][0] for h in headings) - 1) for w in wins]
    assert got.tolist() == want and sorted(set(want)) == [0, 1, 2]
