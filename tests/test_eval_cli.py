"""``python -m eval.ppl`` end to end on a real Lucene index and a tiny local GPT-2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eval.ppl import build_parser, main, parse_config
from ralm.retrieval import read_reference_json
from ralm.tiny import make_gpt2, train_tokenizer

SMALL = ["--stride", "4", "--max-length", "48", "--doc-max-tokens", "20", "--zero-shot-tokens", "8", "--k", "4",
         "--batch-size", "8"]


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
    assert main([*args, "--output-dir", str(out)]) == 0
    return json.loads((out / "results.json").read_text()), out


def test_index_run_then_reference_file_gives_the_same_numbers(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    common = ["--model", str(tiny_gpt2_dir), "--text-file", str(eval_text), *SMALL]
    ref = tmp_path / "retrieval.json"
    for reranker in ("bm25", "zero-shot", "oracle"):
        a, out = run(tmp_path, f"idx-{reranker}", *common, "--index", str(bm25_corpus["index"]),
                     "--reranker", reranker, "--save-retrieval-file", str(ref))
        b, _ = run(tmp_path, f"file-{reranker}", *common, "--retrieval-file", str(ref), "--reranker", reranker)
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
    # Outputs describe themselves and are readable without pickle.
    toks = np.load(out / "tokens.npz", allow_pickle=False)
    assert toks["nll"].shape == (a["n_scored_tokens"],)
    assert (out / "results.md").read_text().startswith("| metric |")
    assert a["retrieval"]["k1"] == 0.9 and a["retrieval"]["b"] == 0.4


def test_zero_shot_with_a_separate_lm_of_another_vocabulary(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    other = tmp_path / "other_lm"
    tok = train_tokenizer([bm25_corpus["text"][:20000]], other, vocab_size=300)
    make_gpt2(other, tok, n_layer=1, n_embd=16, n_head=2, seed=3)
    res, _ = run(tmp_path, "zs-other", "--model", str(tiny_gpt2_dir), "--text-file", str(eval_text), *SMALL,
                 "--index", str(bm25_corpus["index"]), "--reranker", "zero-shot", "--zero-shot-model", str(other))
    assert res["strides_with_document"] > 0 and np.isfinite(res["ppl_word"])


def test_config_yaml_and_errors(tmp_path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("reranker: none\nquery-tokens: 8\nstride: 2\n")
    cfg = parse_config(["--config", str(cfg_file), "--stride", "8"])
    assert (cfg.reranker, cfg.query_tokens, cfg.stride) == ("none", 8, 8)
    with pytest.raises(ValueError, match="needs candidates"):
        parse_config(["--reranker", "bm25"])
    assert main(["--reranker", "nope", "--retrieval-file", str(cfg_file), "--text-file", str(cfg_file),
                 "--model", "x"]) == 2
    assert "eval.ppl: error" in capsys.readouterr().err
    helptext = build_parser().format_help()
    for flag in ("--model", "--text-file", "--retrieval-file", "--index", "--reranker", "--zero-shot-model",
                 "--stride", "--query-tokens", "--k", "--max-length", "--doc-max-tokens", "--zero-shot-tokens",
                 "--batch-size", "--output-dir", "--config"):
        assert flag in helptext


def test_shipped_ppl_configs_parse():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("ppl*.yaml"))
    assert files
    for f in files:
        parse_config(["--config", str(f), "--reranker", "none"])


def test_retrieve_cli_writes_what_eval_ppl_reads(tmp_path, tiny_gpt2_dir, bm25_corpus, eval_text):
    from eval.retrieve import main as retrieve_main

    out = tmp_path / "r.json"
    assert retrieve_main(["--tokenizer", str(tiny_gpt2_dir), "--text-file", str(eval_text), "--index",
                          str(bm25_corpus["index"]), "--output", str(out), "--stride", "4", "--max-length", "48",
                          "--k", "4", "--query-tokens", "32"]) == 0
    entries = read_reference_json(out)
    assert entries[0]["retrieved_docs"] == [] and all(len(e["retrieved_docs"]) == 4 for e in entries[1:])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    ids = tok(eval_text.read_text(), add_special_tokens=False)["input_ids"]
    e = entries[5]  # the query is the decoded 32 tokens just before the targets: only the past
    assert e["query"] == tok.decode(ids[e["begin_location"] - 32:e["begin_location"]])
    res, _ = run(tmp_path, "from-retrieve", "--model", str(tiny_gpt2_dir), "--text-file", str(eval_text), *SMALL,
                 "--retrieval-file", str(out), "--reranker", "bm25")
    assert res["strides_with_document"] == len(entries) - 1
