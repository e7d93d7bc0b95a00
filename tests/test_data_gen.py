"""data_gen.build end to end on a tiny GPT-2 and a small Lucene index built from ``wiki_text``."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
L, S, DOC = 128, 4, 64


@pytest.fixture(scope="module")
def dg_inputs(tmp_path_factory, wiki_text, tiny_gpt2_dir) -> dict:
    """Training text file, a 30-word-passage index of it, and an eval text forbidding two of its titles."""
    from ralm.articles import forbidden_titles, iter_articles
    from ralm.passages import build_index, write_passages

    d = tmp_path_factory.mktemp("dg_inputs")
    (d / "train.txt").write_text(wiki_text, encoding="utf-8")
    n = write_passages(iter_articles(wiki_text), d / "jsonl", shards=1, words=30)
    build_index(d / "jsonl", d / "index", threads=1)
    titles = sorted(forbidden_titles(wiki_text))
    banned = titles[:2]
    (d / "eval.txt").write_text("".join(f" \n = {t} = \n \n some text . \n" for t in banned), encoding="utf-8")
    return {"dir": d, "text": d / "train.txt", "index": d / "index", "eval": d / "eval.txt", "model": tiny_gpt2_dir,
            "n_passages": n, "banned": set(banned)}


def build_args(inp: dict, out: Path, *extra: str) -> list[str]:
    return ["--text.file", str(inp["text"]), "--retrieval.index", str(inp["index"]), "--model", str(inp["model"]),
            "--windows.max_length", str(L), "--windows.doc_max_tokens", str(DOC), "--windows.stride", str(S),
            "--examples", "40", "--shard_size", "16", "--eval_text.file", str(inp["eval"]), "--out", str(out),
            "--batch_examples", "4", "--scoring.batch_size", "32", "--trainer.accelerator", "cpu",
            "--trainer.devices", "1", "--progress", "false", "--scoring.dtype", "float32", *extra]


def cli(args: list[str], env_extra: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "data_gen.build", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def run_cli(args: list[str], timeout: float = 180) -> tuple[int, str]:
    p = cli(args)
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


@pytest.fixture(scope="module")
def built(dg_inputs, tmp_path_factory) -> dict:
    """The reference build: one uninterrupted CLI run (1 thread, like the resume and DDP runs)."""
    out = tmp_path_factory.mktemp("dg_built") / "out"
    rc, log = run_cli(build_args(dg_inputs, out, "--keep_work", "true"))
    assert rc == 0, log
    return {"out": out, "manifest": json.loads((out / "manifest.json").read_text()), "log": log}


def load_rows(out: Path) -> list[dict]:
    import datasets

    return datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train").to_list()


def test_schema_and_manifest(built):
    import pyarrow.parquet as pq

    from ralm.schema import TRAINING_SCHEMA as SCHEMA

    files = sorted(glob.glob(str(built["out"] / "*.parquet")))
    assert len(files) == 3
    for f in files:
        assert pq.read_schema(f).remove_metadata().equals(SCHEMA)
    m = built["manifest"]
    c = m["config"]
    assert m["examples"] == 40 and c["retrieval"]["k"] == 16 and m["L"] == L
    assert c["windows"] == {"stride": S, "max_length": L, "doc_max_tokens": DOC}
    assert m["corpus_passages"] > 16 and c["retrieval"]["k1"] == 0.9 and c["retrieval"]["b"] == 0.4
    assert m["n_forbidden_titles"] == 2
    assert [s["rows"] for s in m["shards"]] == [16, 16, 8]
    # every shard records the dtype its log-probabilities were computed in (here one, the run's)
    assert [s["scoring_dtype"] for s in m["shards"]] == ["float32"] * 3 == [m["scoring_dtype"]] * 3
    assert [pq.read_metadata(f).metadata[b"scoring_dtype"] for f in files] == [b"float32"] * 3
    rows = load_rows(built["out"])
    assert [r["id"] for r in rows] == list(range(40))
    assert len({r["position"] for r in rows}) == 40


def test_logprobs_match_plain_hf_forward(built, dg_inputs):
    """Stored log p(y | d; x) == a single-example HF forward of [doc ; prefix cut from the left]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.reference import last_tokens_logprob

    tok = AutoTokenizer.from_pretrained(dg_inputs["model"])
    model = AutoModelForCausalLM.from_pretrained(dg_inputs["model"]).eval()
    ids = tok(dg_inputs["text"].read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    rows = load_rows(built["out"])
    rng = random.Random(0)
    checked = 0
    for r in rng.sample(rows, 4):
        p = r["position"]
        assert r["prefix_ids"] == ids[p - (L - S):p] and r["target_ids"] == ids[p:p + S]
        assert r["prefix_text"] == tok.decode(r["prefix_ids"]) and r["target_text"] == tok.decode(r["target_ids"])
        assert r["query"] == tok.decode(ids[p - 32:p])
        for j in rng.sample(range(r["n_candidates"]), 3) + [None]:
            doc = [] if j is None else tok(r["doc_texts"][j], max_length=DOC, truncation=True)["input_ids"]
            seq = doc + ids[p + S - (L - len(doc)):p + S]  # [doc ; prefix cut from the left ; y], length L
            assert len(seq) == L
            ref = last_tokens_logprob(model, seq, S)
            got = r["nodoc_logprob"] if j is None else r["lm_logprobs"][j]
            assert got == pytest.approx(ref, abs=1e-4)
            checked += 1
    assert checked == 16


def test_candidates_exclude_source_and_forbidden(built, dg_inputs):
    rows = load_rows(built["out"])
    for r in rows:
        assert r["source_title"] not in r["doc_titles"]
        assert not set(r["doc_titles"]) & dg_inputs["banned"]
        n = r["n_candidates"]
        assert n == len(r["doc_ids"]) == len(r["doc_texts"]) == len(r["bm25_scores"]) == len(r["lm_logprobs"])
        assert n == 16 or r["note"], r
        assert r["bm25_scores"] == sorted(r["bm25_scores"], reverse=True)
        assert all(t.startswith(title + "\n") for t, title in zip(r["doc_texts"], r["doc_titles"]))


def test_rerun_is_a_noop_and_other_config_refused(built, dg_inputs, capsys):
    from data_gen.build import main

    before = {f: os.path.getmtime(f) for f in glob.glob(str(built["out"] / "*"))}
    assert main(build_args(dg_inputs, built["out"])) == 0
    assert "already complete" in capsys.readouterr().err
    assert before == {f: os.path.getmtime(f) for f in glob.glob(str(built["out"] / "*"))}
    # the same files spelled as relative paths are the same configuration
    rel = {k: (os.path.relpath(v) if k in ("text", "index") else v) for k, v in dg_inputs.items()}
    assert main(build_args(rel, built["out"])) == 0
    assert "already complete" in capsys.readouterr().err
    assert main(build_args(dg_inputs, built["out"], "--retrieval.k", "8")) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "retrieval.k: stored 16, now 8" in err
    # a smaller set is a prefix of this one: refused with how to read it, nothing removed
    assert main(build_args(dg_inputs, built["out"], "--examples", "16")) == 2
    err = capsys.readouterr().err
    assert "holds a set of 40 examples" in err and "--data.examples 16" in err, err
    assert before == {f: os.path.getmtime(f) for f in glob.glob(str(built["out"] / "*"))}


def started_build(dg_inputs, out: Path) -> subprocess.Popen:
    """A build (in its own session) once it has written its first scores, still running."""
    p = cli(build_args(dg_inputs, out), start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if glob.glob(str(out / "work" / "scores" / "*" / "ids-*.npz")) or glob.glob(str(out / "*.parquet")):
            break
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before it could be stopped:\n" + p.communicate()[0]
    return p


def killed_build(dg_inputs, out: Path) -> None:
    """Start a build and SIGKILL it once it has written its first scores."""
    p = started_build(dg_inputs, out)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    assert not (out / "manifest.json").exists()


def test_kill_and_resume_gives_same_hash(built, dg_inputs, tmp_path):
    out = tmp_path / "out"
    killed_build(dg_inputs, out)
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0, log
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]
    assert not (out / "work").exists()
    assert not glob.glob(str(out / ".*.tmp"))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_stops_the_build_and_the_same_command_continues(built, dg_inputs, tmp_path, sig):
    """``kill PID`` (SIGTERM to the build alone, as a user or a scheduler sends it) ends the build at the
    next batch with status 143 instead of being swallowed by Lightning's prediction loop (which notes
    it and runs on to the end); Ctrl-C (SIGINT to the process group, as a terminal sends it) likewise with
    130 and one line, where Lightning made it exit 1 with none; the rerun finishes with the reference hash."""
    out = tmp_path / "out"
    p = started_build(dg_inputs, out)
    if sig == "SIGTERM":
        p.send_signal(signal.SIGTERM)
    else:
        os.killpg(p.pid, signal.SIGINT)
    log = p.communicate(timeout=60)[0]
    assert p.returncode == {"SIGTERM": 143, "SIGINT": 130}[sig], log
    assert f"stopped by {'SIGTERM' if sig == 'SIGTERM' else 'Ctrl-C (SIGINT)'}" in log, log
    assert "Traceback" not in log and not (out / "manifest.json").exists()
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0, log
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_a_shard_resumed_in_another_dtype_records_both(dg_inputs, tmp_path):
    """A job resumed on another machine may score in another dtype (``auto`` resolves by the hardware):
    the chunks scored before the kill are marked as bfloat16 here, as if that machine had written them,
    and the shards they belong to say so."""
    import numpy as np

    out = tmp_path / "out"
    killed_build(dg_inputs, out)
    marked = set()
    for f in map(Path, glob.glob(str(out / "work" / "scores" / "shard-*" / "ids-*.npz"))):
        with np.load(f) as z:
            arrays = {k: z[k] for k in z.files}
        np.savez(f, **{**arrays, "dtype": np.array("bfloat16")})
        marked.add(int(f.parent.name.split("-")[1]))
    assert marked, "the killed run left no unfinished shard's scores"
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0, log
    got = [s["scoring_dtype"] for s in json.loads((out / "manifest.json").read_text())["shards"]]
    assert got == ["bfloat16,float32" if s in marked else "float32" for s in range(3)]


def test_damaged_finished_shard_is_refused_then_rebuilt(built, dg_inputs, tmp_path, capsys):
    """A finished dataset whose shard was truncated never passes as complete; after the user deletes
    the shard and the manifest (as the message says), the same command rebuilds exactly that shard."""
    import shutil

    from data_gen.build import main

    out = tmp_path / "copy"
    shutil.copytree(built["out"], out)
    shard = sorted(out.glob("*.parquet"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    assert main(build_args(dg_inputs, out)) == 2
    err = capsys.readouterr().err
    assert shard.name in err and "truncated or modified" in err and err.count("\n") == 1
    shard.unlink()
    (out / "manifest.json").unlink()
    assert main(build_args(dg_inputs, out)) == 0
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_an_lm_placed_by_device_map_gives_the_same_dataset(built, dg_inputs, tmp_path):
    """--scoring.device_map (an LM larger than one device): its second block streamed from disk, the
    rest on CPU; the dataset is the same, bit for bit."""
    from data_gen.build import main

    placement = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "cpu",
                 "transformer.h.1": "disk", "transformer.ln_f": "cpu", "lm_head": "cpu"}
    out = tmp_path / "out"
    assert main(build_args(dg_inputs, out, "--scoring.device_map", json.dumps(placement))) == 0
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(built, dg_inputs, tmp_path):
    out = tmp_path / "out"
    args = build_args(dg_inputs, out)
    args[args.index("--trainer.devices") + 1] = "2"
    rc, log = run_cli(args + ["--trainer.strategy", "ddp"], timeout=240)
    assert rc == 0, log
    assert "world size 2" in log
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_bad_inputs_fail_clearly(dg_inputs, tmp_path, capsys):
    from data_gen.build import main

    def fails(*override: str, match: str) -> Path:
        out = tmp_path / f"out{random.random()}"
        args = build_args(dg_inputs, out)
        for flag, value in zip(override[::2], override[1::2]):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        assert main(args) == 2
        assert match in capsys.readouterr().err
        return out

    (tmp_path / "empty.txt").write_text(" \n \n")
    (tmp_path / "short.txt").write_text(" = A = \n a b c d \n")
    fails("--retrieval.index", str(tmp_path / "nope"), match="--retrieval.index")
    fails("--text.file", str(tmp_path / "missing.txt"), match="does not exist")
    fails("--text.file", str(tmp_path / "empty.txt"), match="is empty")
    fails("--text.file", str(tmp_path / "short.txt"), match="fewer than one 128-token window")
    fails("--model", str(tmp_path / "no-model"), match="--model")
    fails("--windows.doc_max_tokens", "200", match="--windows.doc_max_tokens")
    fails("--examples", "100000000", match="exceeds")
    fails("--shard_size", "0", match="--shard_size")
    # found only once retrieval starts, after config.json and the samples were written: they are removed again,
    # so the corrected command is not refused as another configuration
    assert not fails("--retrieval.k", "100000", match="larger than the corpus").exists()
    fails("--retrieval.kk", "3", match="--help")


def test_index_without_raw_text_is_refused(dg_inputs, tmp_path, capsys):
    from data_gen.build import main
    from ralm.java import anserini_jar, java_binary

    idx = tmp_path / "noraw"
    subprocess.run([str(java_binary()), "-cp", str(anserini_jar()), "io.anserini.index.IndexCollection",
                    "-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
                    "-input", str(dg_inputs["dir"] / "jsonl"), "-index", str(idx), "-threads", "1",
                    "-memoryBuffer", "64", "-quiet", "true"], check=True, capture_output=True)
    args = build_args(dg_inputs, tmp_path / "out")
    args[args.index("--retrieval.index") + 1] = str(idx)
    assert main(args) == 2
    assert "raw" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["wiki_text", "wikitext2"])
def test_article_split_tokenization_equals_whole_text(source, wiki_text, tiny_gpt2_dir):
    from transformers import AutoTokenizer

    from data_gen.sample import tokenize_text
    from ralm.articles import split_articles

    if source == "wiki_text":
        text, tok = wiki_text, AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    else:
        shared = ROOT.parent / "shared" / "data"
        if not (shared / "gpt2-tokenizer" / "vocab.json").exists():
            pytest.skip("needs ../shared/data (GPT-2 tokenizer, WikiText-2)")
        text = (shared / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
        from tokenizers import ByteLevelBPETokenizer
        from transformers import GPT2TokenizerFast

        bpe = ByteLevelBPETokenizer(str(shared / "gpt2-tokenizer" / "vocab.json"),
                                    str(shared / "gpt2-tokenizer" / "merges.txt"))
        tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
        assert tok("hello world")["input_ids"] == [31373, 995]
    pieces, titles = split_articles(text)
    assert "".join(pieces) == text and len(pieces) > 10
    t = tokenize_text(tok, text, progress=False)
    assert len(t.ids) > len(text) // 10
    assert t.ids.tolist() == tok(text, add_special_tokens=False)["input_ids"]
    # the token at each article start decodes to the start of its heading (titles may be detokenized
    # by ralm.corpus, e.g. "( One" -> "(One", so compare without spaces)
    for start, title in zip(t.article_starts[1:6], t.titles[1:6]):
        head = tok.decode(t.ids[start:start + 40].tolist())
        assert head.startswith(" = ") and head.replace(" ", "").startswith(f"={title}=".replace(" ", ""))


def test_sampling_is_reproducible_and_full_length():
    from data_gen.sample import sample_positions

    a = sample_positions(5000, 300, 128, 4, seed=3)
    assert (a == sample_positions(5000, 300, 128, 4, seed=3)).all()
    assert not (a == sample_positions(5000, 300, 128, 4, seed=4)).all()
    assert len(set(a.tolist())) == 300 and a.min() >= 124 and a.max() <= 4996


def test_shipped_build_configs_parse():
    from data_gen.build import build
    from ralm.cli import parse

    files = sorted((ROOT / "configs").rglob("build*.yaml"))
    assert files
    for f in files:
        kw = parse(build, ["--config", str(f)], "build")
        assert kw["examples"] > 0 and kw["trainer"].kwargs()
    kw = parse(build, ["--config", str(ROOT / "configs" / "build.yaml")], "build")
    r, w = kw["retrieval"], kw["windows"]
    assert (kw["examples"], kw["model"], r.k, w.stride, r.query_tokens, w.max_length, w.doc_max_tokens, r.index) == (
        300_000, "gpt2", 16, 4, 32, 1024, 256, "wikipedia-dpr-100w")
    assert kw["text"].name == "wikitext-103-raw-v1" and kw["eval_text"].name == "wikitext-103-v1"


def test_whole_text_fallback_matches_article_split(wiki_text, tiny_gpt2_dir):
    """Tokenizers that merge across headings get one whole-text call; articles found by offsets agree."""
    from transformers import AutoTokenizer

    from data_gen.sample import _tokenize_whole, tokenize_text
    from ralm.articles import split_articles

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    a = tokenize_text(tok, wiki_text, progress=False)
    b = _tokenize_whole(tok, *split_articles(wiki_text))
    assert (a.ids == b.ids).all() and (a.article_starts == b.article_starts).all() and a.titles == b.titles


def test_cli_flags_override_yaml():
    from data_gen.build import build
    from ralm.cli import parse

    kw = parse(build, ["--config", str(ROOT / "configs" / "build.yaml"), "--retrieval.k", "8",
                       "--trainer.devices", "2", "--trainer.strategy", "ddp", "--eval_text.dataset", "null"], "build")
    assert kw["retrieval"].k == 8 and kw["retrieval"].index == "wikipedia-dpr-100w" and kw["examples"] == 300_000
    assert not kw["eval_text"].given
    assert kw["trainer"].kwargs()["devices"] == 2 and kw["trainer"].strategy == "ddp"


def test_source_article_excluded_in_both_spellings():
    """WikiText writes "Kiss You ( One Direction song )", DPR "Kiss You (One Direction song)": drop both."""
    import numpy as np
    import pyarrow as pa

    from data_gen.config import BuildConfig
    from data_gen.retrieve import retrieve_shard
    from ralm.retrieval import Passage
    from ralm.settings import Retrieval, Text, Windows

    written, wiki = "Kiss You ( One Direction song )", "Kiss You (One Direction song)"
    pool = [Passage(str(i), t, f"text {i}", 10.0 - i) for i, t in enumerate([written, wiki, "Other", "Plain", "Third"])]

    class FakeSearch:  # SearchProcess.submit's contract: a future of one candidate list per query
        def submit(self, queries, k, exclude_titles=None, forbidden=()):
            from concurrent.futures import Future

            f = Future()
            f.set_result([[p for p in pool if p.title != ex and p.title not in forbidden][:k] for ex in exclude_titles])
            return f

    class Tok:
        def decode(self, ids):
            return " ".join(map(str, ids))

    build = BuildConfig(examples=2, seed=0, shard_size=2, model="m", text=Text(file="t"), eval_text=Text(dataset=None),
                        retrieval=Retrieval(index="i", k=2, query_tokens=4), windows=Windows(max_length=64, doc_max_tokens=8))
    samples = pa.table({"id": np.arange(2), "position": np.array([40, 50]), "source_title": [written, "Plain"]})
    table = retrieve_shard(FakeSearch(), build, Tok(), np.arange(100), samples, set(), batch=8).to_pylist()
    assert table[0]["doc_titles"] == ["Other", "Plain"]
    assert table[1]["doc_titles"] == [written, wiki]


def test_committed_shards_without_work_dir_are_kept(built, dg_inputs, tmp_path, capsys):
    """Shards that reach a machine without work/ (committed to git, copied) carry no recorded hash: a
    resumed build keeps the ones that hold exactly their examples and scores only the rest."""
    import shutil

    from data_gen.build import main

    out = tmp_path / "committed"
    out.mkdir()
    shards = sorted(built["out"].glob("*.parquet"))
    shutil.copy(built["out"] / "config.json", out)
    shutil.copy(shards[0], out)  # intact
    (out / shards[1].name).write_bytes(shards[1].read_bytes()[:-100])  # truncated: scored again
    assert main(build_args(dg_inputs, out)) == 0
    err = capsys.readouterr().err
    assert f"[score] {40 - 16:,} example(s)" in err, err
    assert shards[1].name in err and shards[0].name not in err
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_a_second_build_on_the_same_out_is_refused_at_once(built, dg_inputs, tmp_path, paused):
    """The first build is paused (SIGSTOP, its lock still held) while the second starts, so the test does
    not depend on the second process starting faster than the first one finishes (CI once lost that race)."""
    out = tmp_path / "out"
    first = cli(build_args(dg_inputs, out), start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None and not glob.glob(str(out / "work" / "scores" / "*" / "*.npz")):
        time.sleep(0.02)
    with paused(first):
        assert first.poll() is None, "the first build ended before the second started:\n" + first.communicate()[0]
        rc, log2 = run_cli(build_args(dg_inputs, out))
    log1, _ = first.communicate(timeout=180)
    assert first.returncode == 0, log1
    assert rc == 2 and str(out) in log2 and f"pid {first.pid} " in log2 and "in use" in log2, log2
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_scores_file_rebuilds_the_dataset_from_its_retrieval(built, dg_inputs, tmp_path):
    """``data_gen.scores_file``: a dataset scored elsewhere travels as its scores alone; its retrieval here
    (the reference build's ``work/``, kept: what ``--stage retrieve`` writes) plus those scores assemble the
    same dataset (content hash) without scoring anything; a directory of other settings is refused."""
    import shutil

    from data_gen.scores_file import export, load_into
    from ralm.settings import InputError

    export(str(built["out"]), str(tmp_path / "scores.npz"))
    out = tmp_path / "out"
    shutil.copytree(built["out"] / "work", out / "work", ignore=shutil.ignore_patterns("scores", "shard_hashes.json"))
    shutil.copy(built["out"] / "config.json", out / "config.json")
    assert not list(out.glob("*.parquet"))
    load_into(str(tmp_path / "scores.npz"), str(out))
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0, log
    assert "[score]" in built["log"] and "[score]" not in log  # the reference build scored; this one scored nothing
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((built["out"] / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "seed": config["seed"] + 1}))
    with pytest.raises(InputError, match="seed"):
        load_into(str(tmp_path / "scores.npz"), str(other))


def test_a_training_text_edited_in_place_is_refused_by_name(built, dg_inputs, tmp_path, capsys):
    """The build records its training text's sha256 (text.json): a text that changed under the same path since
    (here: the record of another content) is refused, exit 2, one line naming the text, not reused."""
    import shutil

    from data_gen.build import main
    from ralm.files import file_sha256

    record = json.loads((built["out"] / "text.json").read_text())
    assert record == {"file": dg_inputs["text"].name, "sha256": file_sha256(dg_inputs["text"])}
    out = tmp_path / "copy"
    shutil.copytree(built["out"], out)
    (out / "text.json").write_text(json.dumps({**record, "sha256": "0" * 64}))
    assert main(build_args(dg_inputs, out)) == 2
    err = capsys.readouterr().err
    assert f"--text.file {dg_inputs['text']} changed since {out} was sampled from it" in err and err.count("\n") == 1


def test_a_manifest_that_is_not_json_is_one_line(built, dg_inputs, tmp_path, capsys):
    """A damaged manifest.json of a finished build: exit 2, one line with the fix, no traceback."""
    import shutil

    from data_gen.build import main

    out = tmp_path / "damaged"
    shutil.copytree(built["out"], out)
    (out / "manifest.json").write_text("{not json")
    assert main(build_args(dg_inputs, out)) == 2
    err = capsys.readouterr().err
    assert "manifest.json is not a readable data_gen manifest" in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def multi_target(dg_inputs, tmp_path_factory) -> dict:
    """4 targets per window, both ways of choosing candidates, 5 windows each (16 examples in shards of 8)."""
    out = {}
    for way in ("own", "shared", "shared-extend"):
        d = tmp_path_factory.mktemp(f"dg_multi_{way}") / "out"
        rc, log = run_cli(build_args(dg_inputs, d, "--examples", "20", "--shard_size", "8", "--targets.per_window", "4",
                                     "--targets.candidates", way.split("-")[0], "--targets.extend",
                                     str(way.endswith("extend")).lower()))
        assert rc == 0, log
        out[way] = load_rows(d)
    return out


@pytest.mark.parametrize("way", ["own", "shared", "shared-extend"])
def test_multi_target_logprobs_match_single_target_transcription(multi_target, dg_inputs, way):
    """Target j of m equals a plain single-target HF forward over its shortened window (the window cut after
    target j: (m - 1 - j) * s tokens shorter, the document overwriting its first positions), so the last target
    equals one-target scoring of its own full window; with ``extend`` (rows of L + (m - 1) * s) the first one
    does. Every candidate and the no-document row of 2 windows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.reference import last_tokens_logprob

    m = 4
    row = L + (m - 1) * S if way.endswith("extend") else L
    tok = AutoTokenizer.from_pretrained(dg_inputs["model"])
    model = AutoModelForCausalLM.from_pretrained(dg_inputs["model"]).eval()
    ids = tok(dg_inputs["text"].read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    rows = sorted(multi_target[way], key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(20))
    for w in (0, 3):
        group = rows[w * m:(w + 1) * m]
        end = group[-1]["position"] + S
        assert [r["position"] for r in group] == [end - (m - j) * S for j in range(m)]
        for j, r in enumerate(group):
            p = r["position"]
            assert r["prefix_ids"] == ids[end - row:p] and r["target_ids"] == ids[p:p + S]
            assert r["query"] == tok.decode(ids[p - 32:p])  # its own query, whichever list it scores
            short = ids[end - row:p + S]  # the shortened window: (m - 1 - j) * s tokens fewer than a row
            if j == (0 if row > L else m - 1):
                assert len(short) == L  # exactly a one-target example's window
            for c in list(range(r["n_candidates"])) + [None]:
                doc = [] if c is None else tok(r["doc_texts"][c], max_length=DOC, truncation=True)["input_ids"]
                seq = doc + short[len(doc):]
                ref = last_tokens_logprob(model, seq, S)
                got = r["nodoc_logprob"] if c is None else r["lm_logprobs"][c]
                assert got == pytest.approx(ref, abs=1e-4), (w, j, c)


def test_multi_target_candidates_own_and_shared(multi_target):
    """own: each target's list is its own retrieval (the shared build's first targets retrieved the same query);
    shared: every target of a window scores its first target's list, BM25 scores included."""
    m = 4
    own = sorted(multi_target["own"], key=lambda r: r["id"])
    shared = sorted(multi_target["shared"], key=lambda r: r["id"])
    assert [r["position"] for r in own] == [r["position"] for r in shared]  # the same sampled windows
    for w in range(len(own) // m):
        first = own[w * m]
        for j in range(m):
            s = shared[w * m + j]
            assert s["query"] == own[w * m + j]["query"]
            assert (s["doc_ids"], s["bm25_scores"]) == (first["doc_ids"], first["bm25_scores"])
        # the first target's candidates score identically both ways (the same rows of the same window)
        assert shared[w * m]["lm_logprobs"] == pytest.approx(first["lm_logprobs"], abs=1e-5)
    # neighbouring queries here differ in 4 of 32 tokens: their own lists differ somewhere
    assert any(own[i]["doc_ids"] != own[i - 1]["doc_ids"] for i in range(1, len(own)) if i % m)


def test_multi_target_settings_are_checked(dg_inputs, tmp_path):
    """A window too short for m targets, or a count that splits a window, is one line before any work."""
    rc, log = run_cli(build_args(dg_inputs, tmp_path / "a", "--examples", "32", "--targets.per_window", "16"))
    assert rc == 2 and "--targets.per_window 16" in log and "doc_max_tokens" in log, log
    rc, log = run_cli(build_args(dg_inputs, tmp_path / "b", "--targets.per_window", "3"))
    assert rc == 2 and "multiple of --targets.per_window (3)" in log, log
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_scores_file_parts_resume_a_build(built, dg_inputs, tmp_path):
    """A build committed in parts: an unfinished build exports its finished shards (a part), ``--shards`` picks
    a range, ``import`` takes several parts, and the build scores only the shard no part held: the same dataset."""
    import shutil

    from data_gen.scores_file import export, load_into, main, shard_hashes

    running = tmp_path / "running"  # the reference build as it was before its last shard and manifest
    shutil.copytree(built["out"], running)
    (running / "manifest.json").unlink()
    last = sorted(running.glob("train-*.parquet"))[-1]
    last.unlink()
    assert main(["export", str(running), str(tmp_path / "a.npz"), "--shards", ":1"]) == 0
    assert "shard 1 of 3, 16 examples" in export(str(running), str(tmp_path / "b.npz"), "1:")
    assert set(shard_hashes([str(tmp_path / "a.npz"), str(tmp_path / "b.npz")])) == {0, 1}
    out = tmp_path / "out"
    shutil.copytree(built["out"] / "work", out / "work", ignore=shutil.ignore_patterns("scores", "shard_hashes.json"))
    shutil.copy(built["out"] / "config.json", out / "config.json")
    load_into([str(tmp_path / "a.npz"), str(tmp_path / "b.npz")], str(out))
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0, log
    assert "[score] 8 example(s)" in log  # the last shard's, and only those
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]
    assert main(["export", str(running), str(tmp_path / "c.npz"), "--shards", "2:"]) == 2  # nothing finished there


def test_first_shards_writes_a_part_that_the_same_command_completes(built, dg_inputs, tmp_path):
    """--first_shards 1: shard 0 written (the reference build's, byte for byte), no manifest, exit 0; a fit can
    read it; the same command without it scores only the rest, into the reference dataset."""
    out = tmp_path / "out"
    rc, log = run_cli(build_args(dg_inputs, out, "--first_shards", "1"))
    assert rc == 0, log
    assert "[score] 16 example(s)" in log and "the first 1 of 3 shards are written" in log, log
    assert [f.name for f in out.glob("train-*.parquet")] == ["train-00000-of-00003.parquet"]
    assert not (out / "manifest.json").exists()
    assert (out / "train-00000-of-00003.parquet").read_bytes() == (
        built["out"] / "train-00000-of-00003.parquet").read_bytes()
    rc, log = run_cli(build_args(dg_inputs, out))
    assert rc == 0 and "[score] 24 example(s)" in log, log
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == built["manifest"]["content_hash"]


def test_an_lm_whose_tokenizer_adds_bos_reads_it_in_every_row(dg_inputs, tiny_llama_dir, tmp_path):
    """A Llama whose tokenizer adds BOS: the no-passage row starts with it as the passage rows do (once), the
    dataset records it; ``--windows.bos passage`` (the reference) leaves it out and is part of the identity."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ralm.scoring import bos_token
    from tests.reference import last_tokens_logprob

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    bos = bos_token(tok)
    ids = tok(dg_inputs["text"].read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    for mode in ("every_row", "passage"):
        out = tmp_path / mode
        args = build_args({**dg_inputs, "model": tiny_llama_dir}, out, "--examples", "8", "--shard_size", "8")
        rc, log = run_cli(args + (["--windows.bos", "passage"] if mode == "passage" else []))
        assert rc == 0, log
        config = json.loads((out / "config.json").read_text())
        assert ("bos" in config["windows"]) == (mode == "passage")
        assert ("every row starts with BOS" in json.loads((out / "manifest.json").read_text())["row_start"]) == (
            mode == "every_row")
        for r in load_rows(out)[:2]:
            p = r["position"]
            window = ids[p + S - L:p + S]
            for c in (0, None):
                doc = (tok(r["doc_texts"][c], max_length=DOC, truncation=True)["input_ids"] if c is not None
                       else [bos] if mode == "every_row" else [])
                assert doc[:1] == ([bos] if c is not None or mode == "every_row" else [])  # one BOS, never two
                seq = doc + window[len(doc):]
                ref = last_tokens_logprob(model, seq, S)
                got = r["nodoc_logprob"] if c is None else r["lm_logprobs"][c]
                assert got == pytest.approx(ref, abs=1e-4), (mode, c)


def test_a_multi_target_build_reads_one_bos_in_every_row(dg_inputs, tiny_llama_dir, tmp_path):
    """4 targets a window (build-multi.yaml's way) with an LM whose tokenizer adds BOS (Gemma's case): every
    target of a window, with every candidate and without, equals a plain forward over its shortened window that
    starts with exactly one BOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ralm.scoring import bos_token
    from tests.reference import last_tokens_logprob

    m, out = 4, tmp_path / "out"
    rc, log = run_cli(build_args({**dg_inputs, "model": tiny_llama_dir}, out, "--examples", "8", "--shard_size", "8",
                                 "--targets.per_window", str(m), "--targets.candidates", "shared",
                                 "--targets.extend", "true"))
    assert rc == 0, log
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    bos = bos_token(tok)
    assert bos is not None
    ids = tok(dg_inputs["text"].read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    group = sorted(load_rows(out), key=lambda r: r["id"])[:m]
    end = group[-1]["position"] + S
    for j, r in enumerate(group):
        short = ids[end - (L + (m - 1) * S):r["position"] + S]
        for c in list(range(r["n_candidates"])) + [None]:
            doc = [bos] if c is None else tok(r["doc_texts"][c], max_length=DOC, truncation=True)["input_ids"]
            assert doc[:1] == [bos] and doc[1:2] != [bos]  # one BOS, never two
            seq = doc + short[len(doc):]
            ref = last_tokens_logprob(model, seq, S)
            got = r["nodoc_logprob"] if c is None else r["lm_logprobs"][c]
            assert got == pytest.approx(ref, abs=1e-4), (j, c)


def test_a_multi_target_build_resumes_from_a_part(dg_inputs, tmp_path):
    """m = 4: a build given the scores of its first shard (a committed part) scores only the rest, in whole windows,
    and ends as the unbroken build did (content hash)."""
    import shutil

    from data_gen.scores_file import export, load_into

    flags = ("--examples", "16", "--shard_size", "8", "--targets.per_window", "4", "--targets.candidates", "shared",
             "--batch_examples", "6")  # 6 examples a step: one window of 4
    whole = tmp_path / "whole"
    rc, log = run_cli(build_args(dg_inputs, whole, *flags, "--keep_work", "true"))
    assert rc == 0, log
    export(str(whole), str(tmp_path / "part.npz"), "0:1")
    out = tmp_path / "out"
    shutil.copytree(whole / "work", out / "work", ignore=shutil.ignore_patterns("scores", "shard_hashes.json"))
    shutil.copy(whole / "config.json", out / "config.json")
    load_into(str(tmp_path / "part.npz"), str(out))
    rc, log = run_cli(build_args(dg_inputs, out, *flags))
    assert rc == 0, log
    assert "[score] 8 example(s) in 2 step(s) of <= 4 examples" in log
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == \
        json.loads((whole / "manifest.json").read_text())["content_hash"]
