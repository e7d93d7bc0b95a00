"""reranking.formats: a bi reranker loads in sentence-transformers, a cross reranker in CrossEncoder and
in transformers' AutoModelForSequenceClassification, each giving the project's numbers."""

from __future__ import annotations

import json
import os

import pytest
import torch

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is a test dependency (.[dev])")

PREFIXES = ["The castle was built in the twelfth century by the", "She moved to the city and worked as a"]
PASSAGES = ["Castle\nThe castle stands on a hill above the river.", "Baker\nA baker makes bread every morning.",
            "River\nThe river floods in spring, and the town was rebuilt twice."]


def exported(tmp_path, encoder_dir, architecture, bm25_weight=0.0, **read):
    from ralm.settings import EncoderInput
    from reranking.export import export
    from reranking.system import RerankerSystem

    torch.manual_seed(0)
    system = RerankerSystem(encoder=str(encoder_dir), pretrained=True, architecture=architecture,
                            bm25_weight=bm25_weight, input=EncoderInput(**read))
    return export(system, tmp_path / f"{architecture}-export")


@pytest.mark.parametrize("frozen", [False, True])
def test_a_bi_reranker_is_two_sentence_transformers_with_the_same_embeddings(tmp_path, tiny_bert_dir, capsys, frozen):
    """Prefixes through DIR, passages through DIR/passages, each cut as the project cuts it (prefixes kept at
    their end, passages at their start, to the same number of encoder tokens), give rank()'s embeddings exactly;
    a query-side reranker's passages are its frozen starting tower's."""
    from ralm.files import FILE_MODE
    from reranking.export import export, load_reranker
    from reranking.formats import main
    from reranking.inputs import encode_texts
    from reranking.system import RerankerSystem
    from ralm.settings import EncoderInput

    torch.manual_seed(0)
    system = RerankerSystem(encoder=str(tiny_bert_dir), pretrained=True, architecture="bi", bm25_weight=0.5,
                            frozen_passages=frozen, input=EncoderInput(max_prefix_tokens=8, max_passage_tokens=10,
                                                                      drop=["<unk>"]))
    if frozen:  # a trained query tower: the two towers differ
        with torch.no_grad():
            for w in system.model.encoder.parameters():
                w.add_(0.01 * torch.randn_like(w))
    src = export(system, tmp_path / "bi-export")
    out = tmp_path / "st"
    assert main(["--reranker", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0.5 x the passage's BM25 score" in printed and "SentenceTransformer(out/passages)" in printed
    assert "remove '<unk>' from prefixes and passages" in printed  # a setting the format cannot hold either
    notes = json.loads((out / "ralm_reranker.json").read_text())
    assert notes["bm25_weight"] == 0.5 and notes["cosine_temperature"] == 0.05 and notes["drop"] == ["<unk>"]

    model, tok, fmt = load_reranker(src)
    with torch.no_grad():
        q = model.embed(**encode_texts(tok, PREFIXES, fmt.max_prefix_tokens, "end"))
        d = model.embed(**encode_texts(tok, PASSAGES, fmt.max_passage_tokens, "start"), passages=True)
    theirs_q = st.SentenceTransformer(str(out), device="cpu").encode(PREFIXES, convert_to_tensor=True)
    theirs_d = st.SentenceTransformer(str(out / "passages"), device="cpu").encode(PASSAGES, convert_to_tensor=True)
    assert torch.allclose(theirs_q.float(), q, atol=1e-5), (theirs_q - q).abs().max()
    assert torch.allclose(theirs_d.float(), d, atol=1e-5), (theirs_d - d).abs().max()
    # rank()'s scores from the two directories as a user loads them, trust_remote_code or not: cosine / τ plus
    # the BM25 prior, as the printed instructions say
    from ralm.retrieval import Passage
    from reranking import load

    passages = [Passage(f"d{j}", *p.split("\n", 1), score=3.0 - j) for j, p in enumerate(PASSAGES)]
    for trust in (False, True):
        q_st = st.SentenceTransformer(str(out), device="cpu", trust_remote_code=trust).encode(
            PREFIXES, convert_to_tensor=True, normalize_embeddings=True).float()
        d_st = st.SentenceTransformer(str(out / "passages"), device="cpu", trust_remote_code=trust).encode(
            PASSAGES, convert_to_tensor=True, normalize_embeddings=True).float()
        for i, prefix in enumerate(PREFIXES):
            mine, _ = load(src).rank(prefix, passages)
            theirs = (d_st @ q_st[i]) / notes["cosine_temperature"] + notes["bm25_weight"] * torch.tensor(
                [p.score for p in passages])
            assert torch.allclose(torch.tensor(mine), theirs, atol=1e-3), (mine, theirs)
    if frozen:
        with torch.no_grad():
            shared = model.embed(**encode_texts(tok, PASSAGES, fmt.max_passage_tokens, "start"))
        assert not torch.allclose(shared, d, atol=1e-3)  # the towers differ, and the passages' is the frozen one
    assert main(["--reranker", str(src), "--out", str(out)]) == 2  # an existing output is refused
    card = (out / "README.md").read_text()  # a converted directory carries its card, without machine paths
    assert "SentenceTransformer(out/passages)" in card and str(tmp_path) not in card + json.dumps(notes)
    assert os.stat(src / "model.safetensors").st_mode & 0o777 == FILE_MODE


@pytest.mark.parametrize("encoder", ["tiny_bert_dir", "tiny_roberta_dir"])
def test_a_cross_reranker_scores_the_same_in_cross_encoder_and_transformers(tmp_path, request, encoder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from reranking.export import load_reranker
    from reranking.formats import main
    from reranking.inputs import encode_pairs

    src = exported(tmp_path, request.getfixturevalue(encoder), "cross", max_length=96, max_prefix_tokens=32)
    out = tmp_path / "ce"
    assert main(["--reranker", str(src), "--out", str(out)]) == 0
    model, tok, fmt = load_reranker(src)
    with torch.no_grad():
        batch = encode_pairs(tok, PREFIXES, PASSAGES[:2], fmt)
        ours = model(**batch)
    assert ours.std() > 0
    pairs = list(zip(PREFIXES, PASSAGES[:2]))
    # a prefix and a passage longer than the budget: the converted model cuts them as the project does
    long = [(" ".join(PREFIXES * 6), " ".join(PASSAGES * 3)), (PREFIXES[0], " ".join(PASSAGES * 4))]
    assert len(tok(long[0][0], add_special_tokens=False)["input_ids"]) > fmt.max_prefix_tokens
    assert len(tok(*long[1])["input_ids"]) > fmt.max_length
    with torch.no_grad():
        ours_long = model(**encode_pairs(tok, [p for p, _ in long], [d for _, d in long], fmt))
    ce = st.CrossEncoder(str(out), device="cpu", trust_remote_code=True)
    theirs_long = torch.as_tensor(ce.predict(long, batch_size=2)).float()
    assert torch.allclose(theirs_long, ours_long, atol=1e-5), (theirs_long, ours_long)
    theirs = torch.as_tensor(ce.predict(pairs, batch_size=2)).float()
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs, ours)
    hf = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    enc = AutoTokenizer.from_pretrained(out)([p for p, _ in pairs], [d for _, d in pairs], padding=True,
                                            return_tensors="pt")
    with torch.no_grad():
        logits = hf(**enc).logits.squeeze(-1)
    assert torch.allclose(logits, ours, atol=1e-5), (logits, ours)
    # forgetting trust_remote_code is refused, never answered by a stock classifier with a random head
    for load in (lambda: st.CrossEncoder(str(out), device="cpu"),
                 lambda: AutoModelForSequenceClassification.from_pretrained(out)):
        with pytest.raises(ValueError, match="trust_remote_code"):
            load()


@pytest.mark.parametrize("architecture", ["bi", "cross"])
def test_a_raw_export_is_refused_by_the_ecosystem_naming_the_converter(tmp_path, tiny_bert_dir, architecture):
    """The export's weights are the reranker's (``encoder.*`` and a head): loaded as a plain encoder they would be
    random. transformers and sentence-transformers refuse it instead, and the refusal names reranking.formats;
    its model card says how to load it."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    src = exported(tmp_path, tiny_bert_dir, architecture, max_prefix_tokens=16, max_passage_tokens=24, max_length=48)
    for load in (AutoModel.from_pretrained, AutoModelForSequenceClassification.from_pretrained, st.SentenceTransformer,
                 st.CrossEncoder):
        with pytest.raises(ValueError, match="reranking.formats"):
            load(str(src))
    card = (src / "README.md").read_text()
    assert "reranking.load" in card and "python -m reranking.formats" in card and "base encoder" in card


def test_an_export_missing_its_encoder_config_is_one_line(tmp_path, tiny_bert_dir):
    from ralm.settings import InputError
    from reranking.export import load_reranker

    src = exported(tmp_path, tiny_bert_dir, "bi", max_prefix_tokens=16, max_passage_tokens=24)
    (src / "encoder_config.json").unlink()
    with pytest.raises(InputError, match="incomplete export: encoder_config.json .* is missing"):
        load_reranker(src)
