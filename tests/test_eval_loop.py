"""The batched strided loop equals a plain, one-stride-at-a-time transcription of the reference."""

from __future__ import annotations

import random

import numpy as np
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval.predict import run_loop
from ralm.retrieval import Passage
from ralm.selectors import BUILTIN, RandomCandidate
from ralm.settings import Scoring, Windows
from ralm.windows import stride_windows, window_ending_at
from tests.reference import strided_nll

STRIDE, L, DOC_MAX, S_PRIME = 4, 48, 20, 8
WINDOWS = Windows(stride=STRIDE, max_length=L, doc_max_tokens=DOC_MAX, zero_shot_tokens=S_PRIME)


@pytest.fixture(scope="module", params=["gpt2", "llama-bos"])
def lm(request, tiny_gpt2_dir, tiny_llama_dir):
    """A GPT-2 (no special tokens) and a Llama whose tokenizer adds BOS: documents then start with it."""
    d = tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    return model, AutoTokenizer.from_pretrained(d)


@pytest.fixture(scope="module")
def setup(lm, wiki_text):
    model, tok = lm
    ids = tok(wiki_text, add_special_tokens=False)["input_ids"][:302]  # 302 % 4 != 0
    assert len(ids) % STRIDE != 0
    n_windows = len(stride_windows(len(ids), STRIDE, L))
    rng = random.Random(0)
    paras = [p.strip() for p in wiki_text.split("\n") if len(p.split()) > 20]
    cands = []
    for i in range(n_windows):
        n = rng.choice([0, 1, 3, 16, 16, 16])  # some strides have fewer (or no) candidates
        cands.append([Passage(docid=f"d{i}-{j}", title=f"T{j}", text=rng.choice(paras), score=10.0 - j)
                      for j in range(n)])
    return ids, cands


def reference_nll(model, tok, ids, cands, strategy, seed=0, row_bos=None):
    return strided_nll(model, tok, ids, cands, strategy, stride=STRIDE, max_length=L, doc_max=DOC_MAX,
                       s_prime=S_PRIME, seed=seed, row_bos=row_bos)


@pytest.mark.parametrize("bos", ["every_row", "passage"])
@pytest.mark.parametrize("strategy", ["none", "bm25", "random", "zero-shot", "oracle", "zero-shot-abstain",
                                      "oracle-abstain"])
def test_batched_loop_matches_plain_reference(lm, setup, strategy, bos):
    """``--windows.bos passage`` is the reference exactly; ``every_row`` (the default) differs from it only where
    the tokenizer adds a BOS (the Llama here), whose windows read without a passage then start with it."""
    from ralm.scoring import bos_token

    model, tok = lm
    ids, cands = setup
    expected = reference_nll(model, tok, ids, cands, strategy, row_bos=bos_token(tok) if bos == "every_row" else None)
    selector = RandomCandidate(seed=0) if strategy == "random" else BUILTIN[strategy]()
    for batch_size in (1, 3, 16) if bos == "every_row" else (3,):
        res = run_loop(ids, tok, model, selector, lambda run: [cands[w.index] for w in run],
                       windows=Windows(**{**WINDOWS.__dict__, "bos": bos}),
                       scoring=Scoring(batch_size=batch_size, dtype="float32"), k=16, strides_per_chunk=5)
        assert res.token_nll.size == len(ids) - 1
        np.testing.assert_allclose(res.token_nll, expected.numpy(), rtol=1e-5, atol=1e-5)
        assert res.nll_sum == pytest.approx(float(expected.sum()), rel=1e-5)
        assert res.nll_sum == pytest.approx(res.nll_sum_tokens, rel=1e-9)
        assert np.array_equal(res.token_ids, np.array(ids[1:]))
    if strategy == "none":
        assert (res.chosen_rank == -1).all()
    elif strategy.endswith("-abstain"):  # no passage chosen on some strides that had candidates, not on all
        has = np.array([len(c) > 0 for c in cands])
        has[0] = False  # the first window never retrieves
        assert (res.chosen_rank[has] == -1).any() and (res.chosen_rank >= 0).any()
    else:  # strides with candidates got one; strides without were scored without a document
        has = np.array([len(c) > 0 for c in cands])
        has[0] = False
        assert ((res.chosen_rank >= 0) == has).all()
        if strategy in ("zero-shot", "oracle", "random"):
            assert (res.chosen_rank > 0).any()  # a test that could fail: not always BM25's first


def test_documents_change_the_scores(lm, setup):
    """Guards against a loop that silently ignores documents."""
    model, tok = lm
    ids, cands = setup
    fn = lambda run: [cands[w.index] for w in run]  # noqa: E731
    kw = dict(windows=WINDOWS, scoring=Scoring(dtype="float32"))
    none = run_loop(ids, tok, model, BUILTIN["none"](), fn, **kw)
    oracle = run_loop(ids, tok, model, BUILTIN["oracle"](), fn, **kw)
    assert oracle.nll_sum < none.nll_sum
    # the oracle that may abstain is never worse than none, nor than the oracle, on any stride
    abstain = run_loop(ids, tok, model, BUILTIN["oracle-abstain"](), fn, **kw)
    assert (abstain.stride_nll <= none.stride_nll + 1e-4).all() and (abstain.stride_nll <= oracle.stride_nll + 1e-4).all()
    assert abstain.nll_sum < oracle.nll_sum


def test_windows_follow_the_reference_arithmetic():
    w = stride_windows(10, 4, 6)
    assert [(x.begin, x.end, x.trg_len) for x in w] == [(0, 6, 6), (4, 10, 4)]
    w = stride_windows(11, 4, 6)
    assert [(x.begin, x.end, x.trg_len) for x in w] == [(0, 6, 6), (4, 10, 4), (8, 11, 1)]
    assert sum(x.n_scored for x in w) == 10
    with pytest.raises(ValueError, match="at least 2"):
        stride_windows(1, 4, 6)


def test_a_training_example_is_an_evaluation_window():
    """Data generation's window for target position p is evaluation's full window whose targets start at p:
    the LM sees the same tokens at training and at test time."""
    for n, s, L in [(40, 4, 12), (41, 3, 7), (64, 8, 8)]:
        full = [w for w in stride_windows(n, s, L)[1:] if w.length == L and w.trg_len == s]
        assert full
        for w in full:
            d = window_ending_at(w.target_begin, s, L)
            assert (d.begin, d.end, d.target_begin, d.trg_len) == (w.begin, w.end, w.target_begin, w.trg_len)
    assert window_ending_at(8, 4, 12).begin == 0
    with pytest.raises(ValueError, match="no room"):
        window_ending_at(7, 4, 12)


def test_row_start_is_one_bos_where_the_tokenizer_adds_one(tiny_gpt2_dir, tiny_llama_dir):
    """GPT-2's tokenizer adds no BOS: rows without a passage start with nothing, in both modes. The Llama's adds
    one: with every_row such a row starts with it, a passage keeps its own (never a second); passage mode adds
    none (the reference)."""
    import torch

    from ralm.scoring import DocumentEncoder, bos_token

    gpt2, llama = AutoTokenizer.from_pretrained(tiny_gpt2_dir), AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert bos_token(gpt2) is None and DocumentEncoder(gpt2).empty == []
    bos = bos_token(llama)
    assert bos == llama.bos_token_id
    docs = DocumentEncoder(llama, max_tokens=8)
    assert docs.empty == [bos] and DocumentEncoder(llama, bos="passage").empty == []
    win = torch.arange(100, 116).repeat(2, 1)
    doc = docs(["a passage about something"])[0]
    rows = docs.condition(win, [None, doc])
    assert rows[0, 0] == bos and rows[0, 1:].tolist() == win[0, 1:].tolist()
    assert rows[1, :len(doc)].tolist() == doc and (rows[1] == bos).sum() == 1
    assert "BOS" in docs.describe() and "no BOS" in DocumentEncoder(gpt2).describe()
