"""``python -m pipeline`` end to end on tiny real components (a BEIR JSONL corpus, a text of titled articles, a
2-layer GPT-2 and BERT): its plan, its report, and a run stopped by SIGTERM in the fit stage that, rerun, ends
with the report and the export of an unbroken run. Every shipped recipe parses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
L, S, DOC = 64, 4, 20


def _yaml(path: Path, obj) -> Path:
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, bm25_corpus, tiny_gpt2_dir, tiny_bert_dir) -> Path:
    """A recipe over the conftest's 300 pseudo-WikiText articles: their passages as a BEIR corpus, the text as
    the training text and its articles 250-253 as the report text (the split stage cuts them out); 30 % of the
    training articles held out for the judge."""
    from ralm.articles import iter_articles
    from ralm.passages import iter_passages

    d = tmp_path_factory.mktemp("recipe")
    (d / "train.txt").write_text(bm25_corpus["text"], encoding="utf-8")
    with open(d / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(iter_passages(iter_articles(bm25_corpus["text"]))):
            f.write(json.dumps({"_id": f"p{i}", "title": title, "text": text}) + "\n")
    windows = {"stride": S, "max_length": L, "doc_max_tokens": DOC}
    build = _yaml(d / "build.yaml", {"examples": 32, "seed": 0, "shard_size": 16, "model": str(tiny_gpt2_dir),
                                     "retrieval": {"k": 4}, "windows": windows, "batch_examples": 4,
                                     "scoring": {"batch_size": 16}, "trainer": {"accelerator": "cpu", "devices": 1}})
    fit = _yaml(d / "fit.yaml", {
        "model": {"encoder": str(tiny_bert_dir), "pretrained": True, "architecture": "bi", "bm25_weight": 0.5,
                  "input": {"max_prefix_tokens": 24, "max_passage_tokens": 24}, "loss": "expected",
                  "optimizer": {"lr": 1e-3, "warmup_steps": 1, "total_steps": 40}},
        "data": {"val_fraction": 0.25, "batch_size": 4, "max_candidates": 4, "num_workers": 0},
        "trainer": {"max_steps": 40, "val_check_interval": 4, "check_val_every_n_epoch": None, "accelerator": "cpu",
                    "devices": 1, "log_every_n_steps": 1, "enable_model_summary": False}})
    ppl = _yaml(d / "ppl.yaml", {"model": str(tiny_gpt2_dir), "retrieval": {"k": 4}, "windows": windows,
                                 "scoring": {"batch_size": 16}, "chunk_strides": 16,
                                 "trainer": {"accelerator": "cpu", "devices": 1}})
    return _yaml(d / "recipe.yaml", {
        "texts": {"train": {"file": str(d / "train.txt")},
                  "report": {"eval": {"file": str(d / "train.txt"), "articles": [250, 254]}}},
        "corpus": {"file": str(d / "corpus.jsonl")},
        "split": {"heldout_fraction": 0.3},
        "data": {"config": str(build), "forbid": ["eval"]},
        "fits": [{"name": "tiny", "configs": [str(fit)], "seeds": [0], "untrained": True}],
        "judge": {"config": str(build), "set": {"examples": 16}, "forbid": ["eval"]},
        "eval": {"config": str(ppl), "rerankers": ["none", "bm25", "cosine", "untrained", "trained", "oracle"],
                 "rows": [{"name": "oracle-k2", "reranker": "oracle", "set": {"retrieval.k": 2}}]},
        "report": {"baselines": ["bm25", "untrained"]}})


def _titled(text: str) -> list[str]:
    from ralm.articles import split_articles

    return [t for t in split_articles(text)[1] if t]


def _pipeline(*args: str) -> int:
    from pipeline.__main__ import main

    return main(list(args))


@pytest.fixture(scope="module")
def straight(recipe) -> Path:
    """The recipe run once, unbroken, in this process."""
    out = recipe.parent / "straight"
    assert _pipeline("--config", str(recipe), "--out", str(out)) == 0
    return out


def _tables(out: Path) -> dict[str, str]:
    """Every comparison table, without its cost column (a timing) and with run paths made relative."""
    got = {}
    for f in sorted((out / "report").rglob("comparison.md")):
        lines = [re.sub(r"\| [^|]* \|$", "|", line) if line.startswith("|") else line for line in f.read_text().splitlines()]
        got[str(f.relative_to(out))] = "\n".join(lines).replace(str(out), "OUT")
    return got


def test_the_plan_lists_the_commands_and_what_is_done(recipe, straight, capsys):
    assert _pipeline("--config", str(recipe), "--out", str(straight), "--print_plan") == 0
    plan = capsys.readouterr().out
    for module in ("pipeline", "ralm.corpus", "data_gen.build", "reranking.fit", "reranking.heldout", "eval.ppl",
                   "eval.compare"):
        assert f"python -m {module} " in plan, module
    # done: every command but the pipeline's own three, the judge and the report's comparisons (cheap; always rerun)
    assert plan.count("   # done") == plan.count("python -m") - 4 - plan.count("python -m eval.compare")
    assert "--trainer.max_steps 0" in plan and "--reuse_from" in plan and f"--out {straight}" in plan
    assert _pipeline("--config", str(recipe), "--out", str(straight), "--stage", "fit", "--print_plan") == 0
    assert set(re.findall(r"python -m ([\w.]+)", capsys.readouterr().out)) == {"reranking.fit"}


def test_a_changed_input_makes_its_step_and_the_steps_reading_it_stale(recipe, straight, capsys):
    """Every finished step records what it was built from (OUT/steps/): a fit YAML edited in place makes the
    fits stale, and through their exports the rows evaluating them, not the data or the other rows; the plan
    marks them, a run refuses before running anything (exit 2, naming the file and what to remove), and the
    same content again is done again."""
    fit = recipe.parent / "fit.yaml"
    original = fit.read_text()
    assert (straight / "steps").is_dir()
    try:
        fit.write_text(original + "# edited\n")
        assert _pipeline("--config", str(recipe), "--out", str(straight), "--print_plan") == 0
        plan = capsys.readouterr().out
        stale = [line for line in plan.splitlines() if "   # stale: " in line]
        assert {line.split("--export_dir ")[-1].split()[0] for line in stale if "reranking.fit" in line} == {
            str(straight / "rerankers" / "tiny-untrained"), str(straight / "rerankers" / "tiny")}
        assert all(f"{fit} changed" in line for line in stale if "reranking.fit" in line)
        rows = {line.split("--output_dir ")[-1].split()[0].rsplit("/", 1)[-1] for line in stale if "eval.ppl" in line}
        assert rows == {"tiny-untrained", "tiny"} and not any("data_gen" in line for line in stale)
        assert _pipeline("--config", str(recipe), "--out", str(straight)) == 2
        err = capsys.readouterr().err
        assert "is stale: " in err and f"{fit} changed since it was built" in err and "nothing was run" in err
        assert f"remove {straight / 'rerankers'}" in err
    finally:
        fit.write_text(original)
    assert _pipeline("--config", str(recipe), "--out", str(straight), "--print_plan") == 0
    assert "# stale" not in capsys.readouterr().out


def test_the_report_holds_every_table_and_artifact(recipe, straight):
    report = (straight / "report" / "report.md").read_text()
    assert "## eval" in report and "### against bm25" in report and "### against tiny-untrained" in report
    vs_bm25 = (straight / "report" / "eval" / "vs-bm25" / "comparison.md").read_text()
    said, table = vs_bm25.split("\n\n", 1)  # eval.compare's notes, then the table
    assert "**Only 4 articles**" in said and report.count(said) == 1  # said once, above the text's tables
    assert table.strip() in report  # pasted whole
    rows = [line.split(" | ")[0].lstrip("| ") for line in vs_bm25.splitlines() if line.startswith("| ")][1:]
    assert rows == ["none", "bm25", "cosine", "tiny-untrained", "tiny", "oracle", "oracle-k2"]
    assert "gap bm25 → oracle closed" in vs_bm25 and (straight / "report" / "eval" / "cost.png").is_file()
    assert f"tensorboard --logdir {straight / 'logs'}" in report and str(straight / "rerankers" / "tiny") in report
    untrained = json.loads((straight / "rerankers" / "tiny-untrained" / "reranker.json").read_text())
    assert untrained["trained"]["fit_steps"] == 0 and untrained["trained"]["steps"] == 0
    assert json.loads((straight / "rerankers" / "tiny" / "reranker.json").read_text())["trained"]["fit_steps"] == 40
    assert len(_titled((straight / "texts" / "eval.txt").read_text())) == 4  # the split stage's 4 articles


def test_the_judge_chooses_on_held_out_articles_and_its_table_is_in_the_report(straight):
    """The judge stage: 16 LM-scored examples of the held-out training articles (none a fit read), every export
    choosing among them, the table pasted whole into the report and its numbers as JSON, each row's mean the
    plain mean of the stored log-probabilities of its choices."""
    held = set(_titled((straight / "texts" / "train-heldout.txt").read_text()))
    judge_ex = pd.concat(pd.read_parquet(f) for f in sorted((straight / "judge" / "data").glob("*.parquet")))
    train_ex = pd.concat(pd.read_parquet(f) for f in sorted((straight / "data").glob("*.parquet")))
    assert len(judge_ex) == 16 and set(judge_ex["source_title"]) <= held
    assert not held & set(train_ex["source_title"])
    table = (straight / "judge" / "judge.md").read_text()
    report = (straight / "report" / "report.md").read_text()
    assert "## the held-out judge" in report and table.strip() in report and "vs tiny-untrained [95% CI]" in table
    numbers = json.loads((straight / "judge" / "judge.json").read_text())
    assert list(numbers["rows"]) == ["cosine", "tiny-untrained", "tiny"] and numbers["examples"] == 16  # the report's rows
    lm = np.array([list(row) for row in judge_ex.sort_values("id")["lm_logprobs"]])
    assert numbers["bm25_first_nll"] == pytest.approx(-lm[:, 0].mean())
    assert numbers["oracle_nll"] == pytest.approx(-lm.max(1).mean())
    for row, got in numbers["rows"].items():
        assert f"| {row} | {got['nll']:.3f} |" in table
        assert numbers["oracle_nll"] <= got["nll"] + 1e-9
    assert json.loads((straight / "corpus" / "corpus.json").read_text())["format"] == "beir"
    assert "[pipeline] all " in (straight / "pipeline.log").read_text()


def test_the_training_prefix_is_what_the_eval_loop_shows_the_reranker(straight, tiny_gpt2_dir):
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)  # the training text: the articles not held out
    ids = tok((straight / "texts" / "train.txt").read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    rows = datasets.load_dataset("parquet", data_files=str(straight / "data" / "*.parquet"), split="train")
    for r in rows.select(range(5)):
        p = r["position"]
        # eval/loop.py decodes the window tokens before the targets: ids[end - L : end - s].
        assert r["prefix_text"] == tok.decode(ids[p - (L - S):p])
        assert r["target_ids"] == ids[p:p + S]


def test_the_export_and_its_best_checkpoint_evaluate_alike(straight, tiny_gpt2_dir):
    from eval.ppl import main

    bests = list((straight / "logs" / "tiny" / "seed0" / "checkpoints").glob("best-*.ckpt"))
    assert len(bests) == 1, bests
    ckpt_run = straight / "ppl-ckpt"
    assert main(["--config", str(Path(straight).parent / "ppl.yaml"), "--text.file", str(straight / "texts" / "eval.txt"),
                 "--retrieval.index", str(straight / "corpus" / "index"), "--reranker", str(bests[0]),
                 "--output_dir", str(ckpt_run)]) == 0
    export, from_ckpt = (json.loads((d / "results.json").read_text()) for d in (straight / "ppl" / "eval" / "tiny", ckpt_run))
    assert export["strides_with_document"] > 0 and np.isfinite(export["ppl_word"])
    assert export["chosen_rank_counts"] == from_ckpt["chosen_rank_counts"]
    assert export["ppl_word"] == pytest.approx(from_ckpt["ppl_word"], rel=1e-9)
    chosen = [pd.read_parquet(d / "strides.parquet", columns=["chosen_docid", "nll"]) for d in
              (straight / "ppl" / "eval" / "tiny", ckpt_run)]
    assert chosen[0]["chosen_docid"].equals(chosen[1]["chosen_docid"])


def test_the_training_set_as_labeled_lists_trains_a_sentence_transformers_cross_encoder(straight, tiny_bert_dir):
    """``data_gen.labeled_lists``: the pipeline's training set as (query, docs, labels = log p(y | d; x)) rows,
    the same values as the shards, which sentence-transformers' CrossEncoderTrainer with ListNetLoss trains on."""
    pytest.importorskip("sentence_transformers", reason="sentence-transformers is a test dependency (.[dev])")
    import datasets
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    from data_gen.labeled_lists import main

    out = straight.parent / "lists"
    assert main(["--data", str(straight / "data"), "--out", str(out), "--k", "3"]) == 0
    lists = datasets.load_dataset("parquet", data_files=str(out / "train.parquet"), split="train")
    shards = datasets.load_dataset("parquet", data_files=str(straight / "data" / "*.parquet"), split="train")
    assert len(lists) == len(shards) == 32
    by_id = {r["id"]: r for r in shards}
    for r in lists.select(range(5)):
        s = by_id[r["id"]]
        assert (r["query"], r["docs"], r["labels"]) == (s["prefix_text"], s["doc_texts"][:3], s["lm_logprobs"][:3])
    model = CrossEncoder(str(tiny_bert_dir), num_labels=1, activation_fn=torch.nn.Identity())
    args = CrossEncoderTrainingArguments(output_dir=str(out / "st"), max_steps=2, per_device_train_batch_size=4,
                                         report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)
    before = [p.detach().clone() for p in model.model.parameters()]
    CrossEncoderTrainer(model=model, args=args, train_dataset=lists.select_columns(["query", "docs", "labels"]),
                        loss=ListNetLoss(model)).train()
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.model.parameters()))


def test_sigterm_in_the_fit_stage_then_the_same_command_gives_the_unbroken_report(recipe, straight):
    """SIGTERM as soon as the fit has its first checkpoint: the pipeline exits 143 and says so, the fit kept
    last.ckpt at the step it was on; the same command then continues and ends with the unbroken run's export
    (byte for byte) and tables (all but the cost column, a timing)."""
    out = recipe.parent / "killed"
    cmd = [sys.executable, "-m", "pipeline", "--config", str(recipe), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    last = out / "logs" / "tiny" / "seed0" / "checkpoints" / "last.ckpt"
    with open(recipe.parent / "killed.log", "wb") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while p.poll() is None and not last.exists():
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=120)
    text = (recipe.parent / "killed.log").read_text()
    assert rc == 143, text[-3000:]
    assert re.search(r"stopped by SIGTERM at step \d+; kept \S+last.ckpt", text), text[-3000:]
    assert "fit: tiny: seed 0: stopped by SIGTERM" in text and not (out / "rerankers" / "tiny").exists()
    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "done already" in rerun.stderr and f"resuming from {last.resolve()}" in rerun.stderr
    weights = [(d / "rerankers" / "tiny" / "model.safetensors").read_bytes() for d in (straight, out)]
    assert weights[0] == weights[1]
    assert _tables(out) == _tables(straight)


def test_a_missing_input_is_named_with_the_command_that_makes_it(tmp_path, capsys):
    """The demo recipe before its world exists (a fresh directory): one line naming the missing files and the
    recipe's prepare command, exit 2, nothing written."""
    demo = str(ROOT / "configs" / "recipes" / "demo.yaml")
    world = tmp_path / "nowhere"
    texts = f"{{train: {{file: {world}/train.txt}}, report: {{eval: {{file: {world}/eval.txt}}}}}}"
    assert _pipeline("--config", demo, "--out", str(tmp_path / "out"), "--texts", texts) == 2
    err = capsys.readouterr().err
    assert f"texts.train.file {world}/train.txt" in err and "no such file; make it first: python -m demo.world" in err
    assert not (tmp_path / "out").exists()


def test_two_pipelines_on_one_out_the_second_is_refused(recipe, tmp_path, paused, capsys):
    """A pipeline holds its run directory (OUT/.lock) while it runs: a second one on the same out is refused at
    once, naming the holder, and writes nothing."""
    out = tmp_path / "shared-out"
    cmd = [sys.executable, "-m", "pipeline", "--config", str(recipe), "--out", str(out)]
    first = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while first.poll() is None and not (out / ".lock").exists():
            time.sleep(0.02)
        with paused(first):
            assert first.poll() is None, "the first pipeline ended before the test could overlap it"
            assert _pipeline("--config", str(recipe), "--out", str(out)) == 2
            err = capsys.readouterr().err
            assert f"--out {out} is in use by pid {first.pid}" in err
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


def test_every_shipped_recipe_parses_into_a_plan(capsys):
    """Each configs/recipes/*.yaml through the pipeline's own parser into its plan; a recipe without texts is a
    change on top of the one its name starts with (demo-seeds on demo), stacked as the recipe's header says."""
    recipes = sorted(r for r in (ROOT / "configs" / "recipes").glob("*.yaml") if not r.name.endswith(".expected.yaml"))
    assert {r.stem for r in recipes} >= {"demo", "demo-seeds", "wikitext2-smollm2", "wikitext2-smollm2-query-side",
                                         "wikitext2-smollm2-cpu"}
    bases = [r for r in recipes if "texts" in yaml.safe_load(r.read_text())]
    for r in recipes:
        base = [] if r in bases else ["--config", str(max((b for b in bases if r.stem.startswith(b.stem)),
                                                          key=lambda b: len(b.stem)))]
        assert f"--config configs/recipes/{r.name}" in r.read_text(), r  # its header shows how to run it
        assert _pipeline(*base, "--config", str(r), "--print_plan") == 0, r
        plan = capsys.readouterr().out
        assert "python -m reranking.fit" in plan and "python -m eval.ppl" in plan, r
    assert _pipeline("--config", str(ROOT / "configs" / "recipes" / "demo.yaml"), "--stage", "fitting") == 2
    assert "--stage / --until 'fitting'" in capsys.readouterr().err


def test_a_recipes_mistakes_are_one_line_and_nothing_is_written(tmp_path, capsys, tiny_bert_dir):
    """An unknown reranker row, a seed twice, a report text the eval does not know, a judge without held-out
    articles or against an unknown row, a baseline nobody evaluates, a fit that never validates, a stage's bad
    value in set, an LM or encoder of the wrong kind: exit 2, one line naming the setting, before any stage writes
    anything."""
    demo = str(ROOT / "configs" / "recipes" / "demo.yaml")
    out = tmp_path / "out"
    for flags, said in ((["--eval.rerankers", "[none,bm25,bm3]"], "eval.rerankers ['bm3']"),
                        (["--fits", '[{name: p, configs: [configs/demo/fit.yaml], seeds: [1, 1]}]'], "seeds [1, 1]"),
                        (["--eval.texts", "[nope]"], "eval.texts ['nope']"),
                        (["--precision", "fp8"], "--precision 'fp8'"),
                        (["--judge", "{config: configs/demo/build.yaml}"], "give split.heldout_fraction > 0"),
                        (["--split.heldout_fraction", "0.5", "--judge", "{config: configs/demo/build.yaml, against: [x]}"],
                         "judge.against ['x']"),
                        (["--report.baselines", "[bm25, random]"], "report.baselines ['random']: not an evaluated row"),
                        (["--fits", '[{name: p, configs: [configs/demo/fit.yaml], set: {trainer.max_steps: -5}}]'],
                         "trainer.max_steps -5 must be"),
                        (["--fits", '[{name: p, configs: [configs/demo/fit.yaml], set: {trainer.max_steps: 30}}]'],
                         "would never validate"),
                        # checked by the stage's own command before the first stage runs
                        (["--eval.set", "{windows.stride: -4}"], "eval step 'eval: zero-shot': invalid windows"),
                        (["--data.set", "{examples: 0}"], "data step 'the training set, LM-scored': invalid build"),
                        # models resolved and of their kind
                        (["--encoder", str(ROOT / "demo" / "assets" / "lm")], "a causal LM; the reranker's encoder"),
                        (["--lm", str(tiny_bert_dir)], "not a causal LM; the LM reads"),
                        (["--lm", str(tmp_path / "no-such-lm")], "lm: model path")):
        assert _pipeline("--config", demo, "--out", str(out), *flags) == 2, flags
        err = capsys.readouterr().err
        assert said in err and len([line for line in err.splitlines() if "error:" in line]) == 1, err
    assert not out.exists()


def test_a_row_of_its_own_is_read_with_its_settings(straight):
    """eval.rows: the oracle over BM25's first 2 (retrieval.k 2, the row's own setting) lies, stride by stride,
    between BM25's first and the oracle over all 4, and it took no other row's LM scores."""
    runs = {name: json.loads((straight / "ppl" / "eval" / name / "results.json").read_text())
            for name in ("bm25", "oracle", "oracle-k2")}
    assert runs["oracle"]["ppl_word"] <= runs["oracle-k2"]["ppl_word"] <= runs["bm25"]["ppl_word"]
    assert runs["oracle"]["ppl_word"] < runs["bm25"]["ppl_word"]
    k2 = runs["oracle-k2"]
    assert set(k2["chosen_rank_counts"]) <= {"0", "1"} and k2["strides_reused"] == 0 and k2["reused_from"] == []
    assert k2["settings"]["retrieval"]["k"] == 2
    strides = {n: pd.read_parquet(straight / "ppl" / "eval" / n / "strides.parquet")["nll"].to_numpy() for n in runs}
    assert (strides["oracle"] <= strides["oracle-k2"] + 1e-4).all()
    assert (strides["oracle-k2"] <= strides["bm25"] + 1e-4).all()


def test_rows_of_their_own_and_another_reading_lm_in_the_plan(tmp_path, capsys, tiny_gpt2_dir):
    """eval.lm reads the texts (every eval.ppl step's --model) while the recipe's lm scores the data; a row's
    own settings come after eval.set's and it takes no LM scores; a row named twice, or with a bad setting,
    is refused before anything runs."""
    demo = str(ROOT / "configs" / "recipes" / "demo.yaml")
    out = str(tmp_path / "out")
    rows = "[{name: bm25-passage, reranker: bm25, set: {windows.bos: passage}}, {name: oracle-k2, reranker: oracle}]"
    assert _pipeline("--config", demo, "--out", out, "--eval.lm", str(tiny_gpt2_dir), "--eval.rows", rows,
                     "--eval.set", "{windows.bos: every_row}", "--print_plan") == 0
    plan = [line for line in capsys.readouterr().out.splitlines() if line.startswith("python -m ")]
    evals = [line for line in plan if line.startswith("python -m eval.ppl ")]
    assert evals and all(f"--model {tiny_gpt2_dir}" in line for line in evals)
    assert all("--model demo/assets/lm" in line for line in plan if line.startswith("python -m data_gen.build"))
    own = next(line for line in evals if "/bm25-passage " in line)
    assert own.endswith("--windows.bos every_row --windows.bos passage") and "--reuse_from" not in own
    assert "--reuse_from" in next(line for line in evals if "/oracle-k2 " in line)  # no settings: it may reuse
    for flags, said in ((["--eval.rows", "[{name: bm25, reranker: bm25}]"], "eval.rows ['bm25']: a name another row"),
                        (["--eval.rows", "[{name: b, reranker: bm25, set: {windows.bos: sideways}}]"],
                         "eval step 'eval: b'"),
                        (["--eval.rows", "[{name: 'a b', reranker: bm25}]"], "eval.rows: name 'a b'")):
        assert _pipeline("--config", demo, "--out", out, *flags) == 2, flags
        assert said in capsys.readouterr().err, flags


def test_the_readmes_walkthrough_recipe_plans(tmp_path, capsys):
    """The recipe of the README's walkthrough, as printed there, parses into a plan of every stage."""
    text = (ROOT / "README.md").read_text()
    block = text.split("# my-recipe.yaml\n", 1)[1].split("```", 1)[0]
    recipe = yaml.safe_load(block)
    for name in ("corpus", "train", "test"):  # its files, made here: the plan reads a corpus's format
        (tmp_path / name).write_text("{}")
    recipe["corpus"]["file"] = str(tmp_path / "corpus")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert _pipeline("--config", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "out"), "--print_plan") == 0
    plan = capsys.readouterr().out
    assert [line for line in plan.splitlines() if line.startswith("# ")] == [
        "# index", "# data", "# fit", "# eval", "# report"]
    assert "--config configs/wikitext2/fit-abstain.yaml" in plan and "--reranker oracle-abstain" in plan


def test_corpus_fields_reach_the_index_command(tmp_path, capsys):
    """A corpus whose columns have other names: the index step reads it with the recipe's corpus.fields."""
    for name in ("train", "test"):
        (tmp_path / name).write_text("= A =\n\nsome text\n")
    pq.write_table(pa.Table.from_pylist([{"doc_no": "d1", "passage_text": "a passage"}]), tmp_path / "c.parquet")
    assert _pipeline("--config", str(ROOT / "configs" / "recipes" / "demo.yaml"), "--out", str(tmp_path / "out"),
                     "--texts", f"{{train: {{file: {tmp_path}/train}}, report: {{test: {{file: {tmp_path}/test}}}}}}",
                     "--data.forbid", "[]", "--corpus", f"{{file: {tmp_path}/c.parquet, fields: {{id: doc_no, text: "
                     "passage_text}}", "--print_plan") == 0
    plan = capsys.readouterr().out
    assert "python -m ralm.corpus" in plan and """--fields '{"id": "doc_no", "text": "passage_text"}'""" in plan, plan


def test_a_later_configs_lists_replace_the_earlier_ones_whole(tmp_path, capsys):
    """An overlay's fits and eval.rows are taken as written, as is a --fits flag after them: jsonargparse alone
    merged a list item by item into the base's list of the same length (an overlay's second fit took the base's
    second fit's loss, its first the base's untrained start)."""
    base = str(ROOT / "configs" / "recipes" / "wikitext2-smollm2.yaml")  # fits: shared (untrained), marginal
    fit = {"configs": ["configs/wikitext2/fit.yaml"], "seeds": [0]}
    one = _yaml(tmp_path / "one.yaml", {"fits": [{"name": "a", **fit}, {"name": "b", **fit}],
                                        "eval": {"rows": [{"name": "r", "reranker": "bm25", "set": {"retrieval.k": 2}}]},
                                        "report": {"baselines": ["bm25"]}})
    two = _yaml(tmp_path / "two.yaml", {"eval": {"rows": [{"name": "s", "reranker": "bm25"}]}})

    def plan(*flags: str) -> list[str]:
        assert _pipeline("--config", base, "--config", str(one), *flags, "--print_plan") == 0
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("python -m ")]

    def exports(lines: list[str]) -> list[str]:
        fits = [line for line in lines if line.startswith("python -m reranking.fit ")]
        assert not any("marginal" in f for f in fits)
        return [f.split("--export_dir ")[1].split()[0].rsplit("/", 1)[1] for f in fits]

    assert exports(plan()) == ["a", "b"]  # one seed each, no untrained start
    assert any("/r " in line and line.endswith("--retrieval.k 2") for line in plan())
    rows = [line for line in plan("--config", str(two)) if line.startswith("python -m eval.ppl ")]
    assert any("/s " in line for line in rows) and not any("retrieval.k 2" in line or "/r " in line for line in rows)
    assert exports(plan("--fits", "[{name: c, configs: [configs/wikitext2/fit.yaml], seeds: [0]}, "
                        "{name: d, configs: [configs/wikitext2/fit.yaml], seeds: [1]}]")) == ["c", "d"]


def test_data_configs_stack_and_scores_come_in_parts(capsys):
    """data.config may be a list (a base, then what differs: build.yaml + build-multi.yaml) and data.scores
    several files (a build committed in parts): the plan passes each, in order."""
    base = str(ROOT / "configs" / "recipes" / "wikitext2-smollm2.yaml")
    configs = "[configs/wikitext2/build.yaml, configs/wikitext2/build-multi.yaml]"
    assert _pipeline("--config", base, "--data.config", configs, "--data.scores", "[a.npz, b.npz]", "--print_plan") == 0
    plan = capsys.readouterr().out
    assert "data_gen.build --config configs/wikitext2/build.yaml --config configs/wikitext2/build-multi.yaml" in plan
    assert "data_gen.scores_file import a.npz b.npz" in plan


def test_a_data_stage_of_the_first_shards_is_done_when_its_last_shard_is(tmp_path):
    """data.set {first_shards: N}: the data step writes a part of the dataset (build.yaml + build-multi.yaml:
    100,000 examples in shards of 2,000) and counts as done when shard N - 1 is written, not at a manifest."""
    from pipeline.__main__ import pipeline
    from pipeline.plan import Recipe, plan
    from ralm.cli import parse

    kw = parse(pipeline, ["--config", str(ROOT / "configs" / "recipes" / "wikitext2-smollm2.yaml"), "--data.config",
                          "[configs/wikitext2/build.yaml, configs/wikitext2/build-multi.yaml]", "--data.set",
                          "{first_shards: 8}", "--out", str(tmp_path)], "p")
    r = Recipe(**{k: v for k, v in kw.items()
                  if k not in ("stage", "until", "print_plan", "verify", "expect", "expected")})
    step = next(s for s in plan(r) if s.stage == "data" and "--first_shards" in s.argv)
    assert step.argv[step.argv.index("--first_shards") + 1] == "8"
    assert step.done == tmp_path / "data" / "train-00007-of-00050.parquet"


def test_the_learning_curve_table_and_plot(tmp_path):
    """A recipe whose fits read nested subsets (wikitext2-smollm2-curve.yaml): the report's curve gives each size's
    seeds, their geometric mean, the change against bm25 and the gap closed, from the rows' results.json."""
    from pipeline import curve
    from pipeline.__main__ import pipeline
    from pipeline.plan import Recipe
    from ralm.cli import parse

    kw = parse(pipeline, ["--config", str(ROOT / "configs" / "recipes" / "wikitext2-smollm2.yaml"), "--config",
                          str(ROOT / "configs" / "recipes" / "wikitext2-smollm2-curve.yaml"), "--out", str(tmp_path)], "p")
    r = Recipe(**{k: v for k, v in kw.items()
                  if k not in ("stage", "until", "print_plan", "verify", "expect", "expected")})
    assert curve.points(r, "report") == []  # nothing evaluated yet: no curve
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"examples": 25000}))
    ppl = {"bm25": 57.0, "oracle": 47.0, "zero-shot": 56.5, "n3125-untrained": 56.4, "n3125-seed0": 56.6,
           "n3125-seed1": 56.2, "n6250-seed0": 56.0, "n6250-seed1": 56.0, "n25000-seed0": 55.0}
    for row, p in ppl.items():
        (tmp_path / "ppl" / "report" / row).mkdir(parents=True)
        (tmp_path / "ppl" / "report" / row / "results.json").write_text(json.dumps({"ppl_word": p}))
    assert [(n, name, ppls) for n, name, ppls in curve.points(r, "report")] == [
        (3125, "n3125", [56.6, 56.2]), (6250, "n6250", [56.0, 56.0]), (25000, "n25000", [55.0])]  # 12,500: not run
    lines = curve.table(r, "report")
    mean = (56.6 * 56.2) ** 0.5
    assert f"| 3,125 | n3125 | 56.600, 56.200 | {mean:.3f} | {100 * (mean / 57 - 1):+.1f}% | " \
           f"{100 * (57 - mean) / 10:.0f}% |" in lines
    assert "| 25,000 | n25000 | 55.000 | 55.000 | -3.5% | 20% |" in lines
    assert curve.plot(r, "report", tmp_path / "curve.png") and (tmp_path / "curve.png").stat().st_size > 1000
    # the held-out judge's curve: the seeds' mean -log p(y | chosen d) and the share of its gap captured
    assert curve.judge_table(r) == []
    nll = {"n3125-untrained": 103.0, "n3125-seed0": 102.9, "n3125-seed1": 102.7, "n12500-seed0": 102.0}
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "judge.json").write_text(json.dumps({
        "examples": 1000, "bm25_first_nll": 103.5, "oracle_nll": 98.5,
        "rows": {k: {"nll": v, "gap_captured": (103.5 - v) / 5} for k, v in nll.items()}}))
    lines = curve.judge_table(r)
    assert "| 3,125 | n3125 | 102.900, 102.700 | 102.800 | -0.700 | 14.0% |" in lines
    assert "| 12,500 | n12500 | 102.000 | 102.000 | -1.500 | 30.0% |" in lines
    assert any("n3125-untrained 103.000 (10.0%)" in line for line in lines)
    assert curve.judge_plot(r, tmp_path / "judge.png") and (tmp_path / "judge.png").stat().st_size > 1000
    from pipeline.report import write_judge_curve  # the judge stage's own file: the curve above the judge's table

    (tmp_path / "judge" / "judge.md").write_text("| reranker | ... |\n")
    assert write_judge_curve(r) == tmp_path / "judge" / "curve.md"
    assert (tmp_path / "judge" / "curve.md").read_text() == "\n".join([*lines, "| reranker | ... |", ""])
