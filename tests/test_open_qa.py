"""ralm.open_qa / eval.qa / demo.questions: SQuAD scoring, question files (incl. the reference's DPR layout), and the
command end to end on a small demo world with real BM25 and a tiny LM."""

from __future__ import annotations

import json

import pytest
import torch


def test_squad_normalisation_exact_match_and_f1():
    from ralm.open_qa import contains_answer, exact_match, f1, normalize_answer

    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert exact_match("the cat sat", ["A cat sat.", "dog"]) == 1.0 and exact_match("cat", ["dog"]) == 0.0
    assert f1("the cat sat", ["a cat sat down"]) == pytest.approx(0.8)  # P 2/2, R 2/3
    assert f1("cat cat", ["cat"]) == pytest.approx(2 / 3) and f1("", ["cat"]) == 0.0 and f1("", [""]) == 1.0
    assert contains_answer("He lives in Saibror .", ["saibror"]) == 1.0
    assert contains_answer("The cat.", ["a cat"]) == 1.0
    assert contains_answer("concatenate", ["cat"]) == 0.0 and contains_answer("anything", [""]) == 0.0  # whole words


def test_question_files_json_lines_and_dpr_layout(tmp_path):
    from ralm.open_qa import read_questions

    (tmp_path / "a.jsonl").write_text('{"question": "q1", "answer": "x"}\n\n{"question": "q2", "answers": ["y", "z"]}\n')
    (tmp_path / "b.json").write_text(json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "7", "title": "T", "text": "body", "score": "1.5"}, {"id": "9", "title": "U", "text": "more"}]}]))
    a, b = read_questions(tmp_path / "a.jsonl"), read_questions(tmp_path / "b.json")
    assert [(q.question, q.answers, q.ctxs) for q in a] == [("q1", ["x"], None), ("q2", ["y", "z"], None)]
    assert [(p.docid, p.title, p.document()) for p in b[0].ctxs] == [("7", "T", "T\nbody"), ("9", "U", "U\nmore")]
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n')
    from ralm.settings import InputError

    with pytest.raises(InputError, match="item 0"):
        read_questions(tmp_path / "bad.jsonl")
    (tmp_path / "strings.json").write_text('["q1", "q2"]')
    with pytest.raises(InputError, match="item 0"):
        read_questions(tmp_path / "strings.json")
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match="is not UTF-8 text"):
        read_questions(tmp_path / "binary.jsonl")


@pytest.fixture(scope="module")
def world_qa(tmp_path_factory):
    from demo.questions import qa_set
    from demo.world import make_world, write_world
    from ralm.corpus import main as corpus

    d = tmp_path_factory.mktemp("qa_world")
    write_world(make_world(n_families=40, n_train_articles=5, n_eval_articles=3, seed=0), d / "world")
    assert corpus(["--text.file", str(d / "world" / "corpus.jsonl"), "--out", str(d / "corpus")]) == 0
    qa_set(str(d / "qa.jsonl"), world=str(d / "world"), split="eval", questions=12, seed=0)
    return d


def test_demo_qa_set_asks_what_people_json_says(world_qa):
    people = {f"{p['first']} {p['surname']}": p for p in json.loads((world_qa / "world" / "people.json").read_text())}
    rows = [json.loads(line) for line in (world_qa / "qa.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and len({r["question"] for r in rows}) == 12
    for r in rows:
        p = people[r["person"]]
        assert p["split"] == "eval" and r["answers"] == [str(p[r["fact"]])] and r["person"] in r["question"]


@pytest.mark.parametrize("reranker", ["none", "bm25", "zero-shot", "oracle"])
def test_the_command_answers_and_scores(world_qa, tiny_gpt2_dir, reranker):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.qa import main
    from ralm.open_qa import PROMPT, _continuation_nll, contains_answer, exact_match, f1

    out = world_qa / "runs" / reranker
    assert main(["--questions", str(world_qa / "qa.jsonl"), "--model", str(tiny_gpt2_dir), "--reranker", reranker,
                 "--retrieval.index", str(world_qa / "corpus" / "index"), "--retrieval.k", "3", "--doc_max_tokens", "24",
                 "--max_new_tokens", "4", "--device", "cpu", "--output_dir", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    res = json.loads((out / "results.json").read_text())
    assert len(rows) == res["questions"] == 12
    assert res["exact_match"] == pytest.approx(sum(exact_match(r["prediction"], r["answers"]) for r in rows) / 12)
    assert res["f1"] == pytest.approx(sum(f1(r["prediction"], r["answers"]) for r in rows) / 12)
    contained = [contains_answer(r["prediction"], r["answers"]) for r in rows]
    assert res["contains_answer"] == pytest.approx(sum(contained) / 12)
    ranks = [r["rank"] for r in rows]
    if reranker == "none":
        assert ranks == [None] * 12
    elif reranker == "bm25":
        assert ranks == [0] * 12
    else:
        assert all(r in (0, 1, 2) for r in ranks)
    if reranker == "oracle":  # the passage under which the gold answer is most likely, checked for one question
        from ralm.search_process import SearchProcess

        lm, tok = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval(), AutoTokenizer.from_pretrained(tiny_gpt2_dir)
        sp = SearchProcess(str(world_qa / "corpus" / "index"))
        hits = sp.search([rows[0]["question"]], 3)[0]
        sp.close()
        docs = [tok.decode(tok(p.document(), max_length=24, truncation=True)["input_ids"]) for p in hits]
        nll = _continuation_nll(lm, tok, [PROMPT.format(document=d, question=rows[0]["question"]) for d in docs],
                                " " + rows[0]["answers"][0])
        assert rows[0]["rank"] == int(torch.tensor(nll).argmin())
