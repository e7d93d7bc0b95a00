"""ralm.generation against a plain transcription: one token at a time, a full forward per token, no cache,
no batching, BM25 through the search process and the document placed as evaluation places it."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [" = Tenmidu River = \n \n It brigu a brine album tenmidu first", "Brine born tenmidu two this at selra",
           " The village of gufa brika"]  # words of the test corpus (ralm.tiny's pseudo-English)


def plain_generation(lm, tok, prompt, search, k, stride, query_tokens, max_length, doc_max_tokens, n_new,
                     row_bos=None):
    """Greedy, BM25's first passage every ``stride`` tokens, placed as evaluation places it (a row without one
    starting with ``row_bos`` where given)."""
    ids = list(tok(prompt, add_special_tokens=False)["input_ids"])
    new, docids = [], []
    while len(new) < n_new:
        t0 = len(ids)
        s = min(stride, n_new - len(new))
        end = t0 + s
        query = tok.decode(ids[max(0, t0 - query_tokens):t0])
        hits = search.search([query], k)[0]
        docids.append(hits[0].docid if hits else None)  # a query of unknown words finds nothing
        doc = (tok(hits[0].document(), max_length=doc_max_tokens, truncation=True)["input_ids"] if hits
               else [row_bos] if row_bos is not None else [])
        begin = max(0, end - (max_length - len(doc)))  # evaluation: doc + the window's last L - |doc| tokens
        for _ in range(s):
            with torch.no_grad():
                logits = lm(torch.tensor([doc + ids[begin:]])).logits[0, -1]
            ids.append(int(logits.argmax()))
            new.append(ids[-1])
    return new, docids


@pytest.fixture(scope="module")
def search(bm25_corpus):
    from ralm.search_process import SearchProcess

    sp = SearchProcess(str(bm25_corpus["index"]))
    yield sp
    sp.close()


@pytest.mark.parametrize("max_length", [48, 1024])  # contexts longer than the window, and shorter
@pytest.mark.parametrize("model", ["gpt2", "llama-bos"])  # a tokenizer without BOS, and one that adds it
def test_greedy_bm25_generation_equals_the_plain_transcription(tiny_gpt2_dir, tiny_llama_dir, search, max_length,
                                                               model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ralm.generation import Decoding, generate
    from ralm.scoring import bos_token
    from ralm.selectors import BM25First, NoRetrieval
    from ralm.settings import Retrieval, Windows

    d = tiny_gpt2_dir if model == "gpt2" else tiny_llama_dir
    lm = AutoModelForCausalLM.from_pretrained(d).eval()
    tok = AutoTokenizer.from_pretrained(d)
    settings = dict(k=4, stride=5, query_tokens=8, max_length=max_length, doc_max_tokens=16)
    core = dict(retrieval=Retrieval(k=4, query_tokens=8), windows=Windows(stride=5, max_length=max_length,
                doc_max_tokens=16), decoding=Decoding(max_new_tokens=13))
    gens = generate(lm, tok, PROMPTS, BM25First(), search, **core)
    for prompt, g in zip(PROMPTS, gens):
        want, docids = plain_generation(lm, tok, prompt, search, n_new=13, row_bos=bos_token(tok), **settings)
        assert g.token_ids == want, prompt
        assert [r["docid"] for r in g.retrievals] == docids and [r["token"] for r in g.retrievals] == [0, 5, 10]
        assert [r["rank"] for r in g.retrievals] == [0 if d else None for d in docids] and g.text == tok.decode(want)
        assert any(docids), "no query found a passage: the test would not exercise the placement"
    alone = generate(lm, tok, PROMPTS[1:2], BM25First(), search, **core)[0]
    assert alone.token_ids == gens[1].token_ids  # left padding in a batch changes nothing
    if bos_token(tok) is not None:  # no passage: the row starts with the LM's BOS, as evaluation's rows do
        class Nothing:  # a retriever that finds nothing, so the transcription places no passage
            @staticmethod
            def search(queries, k):
                return [[] for _ in queries]

        none = generate(lm, tok, PROMPTS[:1], NoRetrieval(), None, **core)[0]
        want, _ = plain_generation(lm, tok, PROMPTS[0], Nothing(), n_new=13, row_bos=bos_token(tok), **settings)
        assert none.token_ids == want


def test_context_row_is_the_evaluation_row():
    """For a context at least a window long, the row is condition_on_documents on the window that ends
    where the stride ends, cut before the stride's first target."""
    from ralm.generation import context_row
    from ralm.scoring import condition_on_documents

    ids = list(range(100, 160))
    doc = [1, 2, 3, 4, 5]
    for t0, s, L in ((40, 4, 20), (60, 1, 60), (30, 8, 30)):
        end = t0 + s
        window = torch.tensor([(ids + [0] * 10)[end - L:end]])
        want = condition_on_documents(window, [doc])[0, : L - s].tolist()
        assert context_row(ids[:t0], doc, end, L) == want, (t0, s, L)
    assert context_row(ids[:10], doc, 14, 60) == doc + ids[:10]  # short context: the document goes in front


def test_sampling_is_seeded_and_the_stop_string_ends_a_continuation(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ralm.generation import Decoding, generate
    from ralm.selectors import NoRetrieval
    from ralm.settings import Windows

    lm = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    w = Windows(stride=4)
    run = lambda seed: generate(lm, tok, PROMPTS, NoRetrieval(), windows=w,
                                decoding=Decoding(max_new_tokens=12, sample=True, seed=seed))
    a, b, c = run(0), run(0), run(1)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] != [g.token_ids for g in c]
    greedy = generate(lm, tok, PROMPTS[:1], NoRetrieval(), windows=w, decoding=Decoding(max_new_tokens=12))[0]
    word = greedy.text.split()[2]
    stopped = generate(lm, tok, PROMPTS[:1], NoRetrieval(), windows=w,
                       decoding=Decoding(max_new_tokens=12, stop=word))[0]
    assert word not in stopped.text and greedy.text.startswith(stopped.text)
    assert all(r["docid"] is None for r in greedy.retrievals)


def test_the_command_writes_each_generation_with_its_passages(tmp_path, tiny_gpt2_dir, bm25_corpus, search, capsys):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.generate import main
    from ralm.generation import Decoding, generate
    from ralm.selectors import BM25First
    from ralm.settings import Retrieval, Windows

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(p.replace("\n", "\\n") for p in PROMPTS) + "\n")
    out = tmp_path / "gen.jsonl"
    flags = ["--windows.stride", "5", "--windows.max_length", "48", "--windows.doc_max_tokens", "16",
             "--retrieval.k", "4", "--retrieval.query_tokens", "8", "--max_new_tokens", "13"]
    assert main(["--model", str(tiny_gpt2_dir), "--retrieval.index", str(bm25_corpus["index"]), "--reranker", "bm25",
                 "--prompts_file", str(prompts), "--batch_size", "2", "--out", str(out), "--device", "cpu", *flags]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    lm = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    want = generate(lm, tok, PROMPTS, BM25First(), search, retrieval=Retrieval(k=4, query_tokens=8),
                    windows=Windows(stride=5, max_length=48, doc_max_tokens=16), decoding=Decoding(max_new_tokens=13))
    assert [r["prompt"] for r in rows] == PROMPTS
    assert [r["token_ids"] for r in rows] == [g.token_ids for g in want]
    assert [r["retrievals"] for r in rows] == [g.retrievals for g in want]
    capsys.readouterr()
    assert main(["--model", str(tiny_gpt2_dir), "--reranker", "none", "--prompt", PROMPTS[0], "--device", "cpu",
                 *flags]) == 0
    assert capsys.readouterr().out.strip()  # one prompt streams its text
    assert main(["--model", str(tiny_gpt2_dir), "--reranker", "oracle", "--prompt", "x"]) == 2
    assert "not offered for generation" in capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [(["--max_new_tokens", "-5"], "--max_new_tokens must be >= 1"),
                                         (["--top_p", "0"], "--top_p must be in (0, 1]")])
def test_decoding_settings_that_cannot_work_are_one_line(flags, said, capsys):
    from eval.generate import main

    assert main(["--prompt", "x", "--reranker", "none", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
