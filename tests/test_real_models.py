"""The real pretrained models (``python -m ralm.models fetch smollm2-135m minilm-l6``, done by
scripts/setup.sh) through the fast code, against the plain single-example transcriptions in
tests/reference.py. SmolLM2's tokenizer differs from GPT-2's (49,152 ids, a Llama vocabulary), so
these check that nothing assumes GPT-2's tokenization."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ralm import loading, models

pytestmark = pytest.mark.skipif(
    not (models.is_fetched("smollm2-135m") and models.is_fetched("minilm-l6")),
    reason="needs the real models: python -m ralm.models fetch smollm2-135m minilm-l6 (scripts/setup.sh does it)")

STRIDE, L, DOC_MAX, S_PRIME = 8, 64, 24, 8


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    torch.set_num_threads(2)
    return loading.load_causal_lm("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def text_and_cands(wiki_text, smollm):
    from ralm.retrieval import Passage
    from ralm.windows import stride_windows

    _, tok = smollm
    ids = tok(wiki_text, add_special_tokens=False)["input_ids"][:131]
    rng = random.Random(0)
    paras = [p.strip() for p in wiki_text.split("\n") if len(p.split()) > 20]
    n = len(stride_windows(len(ids), STRIDE, L))
    cands = [[Passage(f"d{i}-{j}", f"T{j}", rng.choice(paras), 9.0 - j) for j in range(rng.choice([0, 3, 3]))]
             for i in range(n)]
    return ids, cands


@pytest.mark.parametrize("strategy", ["none", "bm25", "zero-shot", "oracle"])
def test_smollm2_loop_matches_plain_reference(smollm, text_and_cands, strategy):
    from eval.predict import run_loop
    from ralm.selectors import BUILTIN
    from ralm.settings import Scoring, Windows
    from tests.reference import strided_nll

    model, tok = smollm
    ids, cands = text_and_cands
    expected = strided_nll(model, tok, ids, cands, strategy, stride=STRIDE, max_length=L, doc_max=DOC_MAX,
                           s_prime=S_PRIME)
    res = run_loop(ids, tok, model, BUILTIN[strategy](), lambda run: [cands[w.index] for w in run],
                   windows=Windows(stride=STRIDE, max_length=L, doc_max_tokens=DOC_MAX, zero_shot_tokens=S_PRIME),
                   scoring=Scoring(batch_size=5, dtype="float32"), k=3, strides_per_chunk=4)
    np.testing.assert_allclose(res.token_nll, expected.numpy(), rtol=1e-4, atol=1e-4)
    assert res.token_nll.mean() < 8.0  # a real LM: far below log(49152) = 10.8


def test_smollm2_ranks_for_a_generator_of_another_vocabulary(smollm, text_and_cands, tiny_gpt2_dir):
    """Paper Table 3: a separate LM ranks. Its picks equal a one-candidate-at-a-time transcription."""
    from transformers import AutoTokenizer

    from ralm.selectors import StrideBatch, ZeroShotOtherLM
    from tests.reference import zero_shot_pick

    model, tok = smollm
    gen_tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    _, cands = text_and_cands
    idx = [i for i, c in enumerate(cands) if c][:4]
    prefixes = [" ".join(cands[i][0].text.split()[:40]) for i in idx]  # text the generator's tokenizer made
    assert gen_tok(prefixes[0])["input_ids"] != tok(prefixes[0])["input_ids"]
    sel = ZeroShotOtherLM(model, tok, rank_tokens=S_PRIME, doc_max_tokens=DOC_MAX, max_length=L, batch_size=2)
    picks = sel.select(StrideBatch(prefixes, [cands[i] for i in idx], idx))
    ref = [zero_shot_pick(model, tok, p, [c.document() for c in cands[i]], rank_tokens=S_PRIME, doc_max=DOC_MAX,
                          max_length=L) for p, i in zip(prefixes, idx)]
    assert list(picks) == ref


def test_smollm2_training_targets_match_plain_forward(smollm, text_and_cands, tmp_path):
    """data_gen's stored log p(y | d; x) for SmolLM2 (ChunkDataset rows -> LMScoringModule) == a single
    forward of [doc ; prefix cut from the left ; y] per candidate."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_gen.score import ChunkDataset, LMScoringModule
    from tests.reference import target_logprob

    model, tok = smollm
    ids, cands = text_and_cands
    docs = [c.document() for c in next(c for c in cands if c)]
    position = 90
    np.save(tmp_path / "tokens.npy", np.asarray(ids, dtype=np.int32))
    pq.write_table(pa.table({"id": [0], "position": [position], "doc_texts": [docs]}), tmp_path / "r.parquet")
    ds = ChunkDataset([(0, [0])], {0: str(tmp_path / "r.parquet")}, str(tmp_path / "tokens.npy"), "smollm2-135m",
                      window=L, stride=STRIDE, doc_max_tokens=DOC_MAX, failed_path=str(tmp_path / "failed"))
    module = LMScoringModule(model, stride=STRIDE, batch_size=3, dtype="float32")
    module.on_predict_start()
    got = module.predict_step(ds[0], 0)["logprobs"].tolist()  # candidates in rank order, then no document
    ref = [target_logprob(model, tok, ids, position, d, stride=STRIDE, max_length=L, doc_max=DOC_MAX) for d in docs]
    ref.append(target_logprob(model, tok, ids, position, None, stride=STRIDE, max_length=L, doc_max=DOC_MAX))
    np.testing.assert_allclose(got, ref, atol=2e-4)
    assert len(set(np.round(got, 3))) > 1  # the documents matter


def test_minilm_cross_encoder_pairs_use_bert_conventions():
    """BERT-family encoders: [CLS] prefix [SEP] passage [SEP], token type ids 0/1, no padding to 128."""
    from reranking.inputs import InputFormat, encode_pairs

    tok = loading.load_tokenizer("minilm-l6")
    enc = encode_pairs(tok, ["the prefix words", "x " * 400], ["a passage", "another passage here"],
                       InputFormat(max_length=96, max_prefix_tokens=32))
    ids, tt, am = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
    passage = len(tok("another passage here", add_special_tokens=False)["input_ids"])
    assert ids.shape == (2, 1 + 32 + 1 + passage + 1) == (2, int(am[1].sum()))  # prefix cut to 32 tokens, from the left
    assert am[0].sum() < 12  # the short pair is padded only to the batch's longest (not to 128)
    assert ids[0, 0] == tok.cls_token_id and (ids[0] == tok.sep_token_id).sum() == 2
    first_sep = int((ids[0] == tok.sep_token_id).nonzero()[0])
    assert (tt[0, :first_sep + 1] == 0).all() and (tt[0, first_sep + 1:int(am[0].sum())] == 1).all()
    assert tok.decode(ids[0][am[0].bool()]) == "[CLS] the prefix words [SEP] a passage [SEP]"


def test_smollm2_generation_equals_the_plain_transcription(smollm, bm25_corpus):
    """``ralm.generation`` with SmolLM2 (another tokenizer than GPT-2's, a Llama-family model): the same tokens
    and passages as the one-token-at-a-time transcription of tests/test_generation.py, batched prompts included."""
    from ralm.generation import Decoding, generate
    from ralm.search_process import SearchProcess
    from ralm.selectors import BM25First
    from ralm.settings import Retrieval, Windows
    from tests.test_generation import PROMPTS, plain_generation

    lm, tok = smollm
    sp = SearchProcess(str(bm25_corpus["index"]))
    try:
        gens = generate(lm, tok, PROMPTS, BM25First(), sp, retrieval=Retrieval(k=4, query_tokens=8),
                        windows=Windows(stride=5, max_length=L, doc_max_tokens=DOC_MAX),
                        decoding=Decoding(max_new_tokens=12))
        for prompt, g in zip(PROMPTS, gens):
            want, docids = plain_generation(lm, tok, prompt, sp, k=4, stride=5, query_tokens=8, max_length=L,
                                            doc_max_tokens=DOC_MAX, n_new=12)
            assert g.token_ids == want, prompt
            assert [r["docid"] for r in g.retrievals] == docids
        assert any(r["docid"] for g in gens for r in g.retrievals), "no passage was placed: the test would be vacuous"
    finally:
        sp.close()
