"""Unit tests of the reranker: losses against plain references, input format, data split, selector."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ralm.settings import EncoderInput
from reranking.inputs import InputFormat, encode_pairs
from reranking.loss import DistillationLoss, ExpectedNLLLoss, MarginalLikelihoodLoss


def naive_marginal(scores, lm, mask=None, dtype=torch.float64):
    """-log(sum_j softmax(f)_j * exp(lm_j)) in probability space (underflows for very negative lm)."""
    scores, lm = scores.to(dtype), lm.to(dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1) * torch.exp(lm)
    if mask is not None:
        p = torch.where(mask, p, torch.zeros_like(p))
    return -torch.log(p.sum(-1)).mean()


# ------------------------------------------------------------------------------------------ losses
@pytest.mark.parametrize("B,k", [(1, 1), (3, 5), (7, 16)])
def test_marginal_loss_matches_naive_value_and_gradient(B, k):
    g = torch.Generator().manual_seed(B * 100 + k)
    f = torch.randn(B, k, generator=g, dtype=torch.float64)
    lm = -5 - 20 * torch.rand(B, k, generator=g, dtype=torch.float64)  # well-conditioned: exp(-25) is fine in f64
    f1, f2 = f.clone().float().requires_grad_(), f.clone().requires_grad_()
    ours = MarginalLikelihoodLoss()(f1, lm.float())
    ref = naive_marginal(f2, lm)
    ours.backward()
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(f1.grad.double(), f2.grad, rtol=1e-4, atol=1e-6)


def test_marginal_loss_finite_where_naive_underflows():
    f = torch.tensor([[0.3, -1.2, 2.0, 0.0]], requires_grad=True)
    lm = torch.tensor([[-200.0, -230.0, -215.0, -260.0]])
    assert math.isinf(naive_marginal(f.detach(), lm, dtype=torch.float32).item())  # float32 probabilities vanish...
    assert math.isinf(naive_marginal(f.detach(), lm * 4).item())      # ...and float64 ones too, further out
    loss = MarginalLikelihoodLoss()(f, lm)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(f.grad).all()
    # Stable float64 reference: shift by the max before exponentiating.
    log_q = torch.log_softmax(f.detach().double(), -1)
    ref = -torch.logsumexp(log_q + lm.double(), -1).mean()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    # The gradient pushes mass towards the best candidate (index 0: -200).
    assert f.grad[0, 0] < 0


def test_masked_candidates_have_no_effect():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(4, 6, generator=g)
    lm = -5 - 30 * torch.rand(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    garbage_f, garbage_lm = f.clone(), lm.clone()
    garbage_f[~mask] = 1e4
    garbage_lm[~mask] = float("nan")
    for loss_fn in (MarginalLikelihoodLoss(), DistillationLoss(temperature=2.0), ExpectedNLLLoss()):
        a = f.clone().requires_grad_()
        b = garbage_f.clone().requires_grad_()
        la, lb = loss_fn(a, lm, mask), loss_fn(b, garbage_lm, mask)
        la.backward()
        lb.backward()
        assert torch.isfinite(lb)
        assert la.item() == pytest.approx(lb.item(), rel=1e-6)
        assert (b.grad[~mask] == 0).all()
        torch.testing.assert_close(a.grad[mask], b.grad[mask])
        # Row 0 alone, truncated to its 3 real candidates, gives the same per-example loss.
        assert loss_fn.per_example(f, lm, mask)[0].item() == pytest.approx(
            loss_fn.per_example(f[:1, :3], lm[:1, :3]).item(), rel=1e-6)
    assert MarginalLikelihoodLoss()(f, lm, mask).item() == pytest.approx(naive_marginal(f, lm, mask).item(), rel=1e-5)


def test_expected_nll_matches_a_loop_over_candidates():
    """Each example: sum over its real candidates of softmax(f)_j * -lp_j, written out one by one in float64;
    and the gradient on f_j is q_j * (E_q[lp] - lp_j), as the docstring says."""
    g = torch.Generator().manual_seed(2)
    f = torch.randn(4, 6, generator=g, dtype=torch.float64)
    lm = -60 - 60 * torch.rand(4, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 5] = False
    want = []
    for b in range(4):
        real = [j for j in range(6) if mask[b, j]]
        z = sum(math.exp(f[b, j].item()) for j in real)
        want.append(sum(math.exp(f[b, j].item()) / z * -lm[b, j].item() for j in real))
    x = f.float().requires_grad_()
    ours = ExpectedNLLLoss().per_example(x, lm.float(), mask)
    assert ours.tolist() == pytest.approx(want, rel=1e-6)
    ours.mean().backward()
    q = torch.softmax(f.masked_fill(~mask, float("-inf")), -1)
    lp = lm.masked_fill(~mask, 0.0)
    grad = q * ((q * lp).sum(-1, keepdim=True) - lp) / 4  # the mean over 4 examples
    torch.testing.assert_close(x.grad.double(), grad, rtol=1e-4, atol=1e-5)
    # A sharp reranker's expected NLL is the NLL of the candidate it picks (what evaluation measures).
    sharp = ExpectedNLLLoss().per_example(f.float() * 1e4, lm.float(), mask)
    picked = -lm.masked_fill(~mask, 0.0).gather(1, f.masked_fill(~mask, float("-inf")).argmax(1, keepdim=True))
    torch.testing.assert_close(sharp.double(), picked.squeeze(1), rtol=1e-6, atol=1e-4)


def test_loss_shape_errors_quote_both_shapes():
    with pytest.raises(ValueError, match=r"scores \(2, 3\) and lm_logprobs \(2, 4\)"):
        MarginalLikelihoodLoss()(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"mask \(2, 2\) must match scores \(2, 3\)"):
        DistillationLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"examples \[1\] have no unmasked candidate"):
        MarginalLikelihoodLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]).bool())
    with pytest.raises(ValueError, match="temperature must be > 0"):
        DistillationLoss(temperature=0)


def test_distillation_matches_kl_div_batchmean():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(5, 7, generator=g, requires_grad=True)
    lm = -5 - 40 * torch.rand(5, 7, generator=g)
    tau = 3.0
    ours = DistillationLoss(tau)(f, lm)
    ref = F.kl_div(torch.log_softmax(f, -1), torch.log_softmax(lm / tau, -1), reduction="batchmean", log_target=True)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    (ga,) = torch.autograd.grad(ours, f)
    (gb,) = torch.autograd.grad(ref, f)
    torch.testing.assert_close(ga, gb)


# ------------------------------------------------------------------------------------------ inputs
@pytest.fixture(scope="module")
def roberta_tok(tiny_roberta_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_roberta_dir)


def test_encode_pairs_matches_tokenizer_when_short(roberta_tok):
    prefixes, passages = ["the city river", "a war album in the north"], ["Title\nsome text here", "X\ny"]
    ours = encode_pairs(roberta_tok, prefixes, passages, InputFormat(max_length=64, max_prefix_tokens=32))
    ref = roberta_tok(prefixes, passages, padding="longest", return_tensors="pt")
    torch.testing.assert_close(ours["input_ids"], ref["input_ids"])
    torch.testing.assert_close(ours["attention_mask"], ref["attention_mask"])


def test_encode_pairs_cuts_prefix_left_passage_right(roberta_tok, wiki_text):
    words = wiki_text.split()
    prefix, passage = " ".join(words[:300]), " ".join(words[300:700])
    fmt = InputFormat(max_length=40, max_prefix_tokens=12)
    enc = encode_pairs(roberta_tok, [prefix, "short"], [passage, "tiny"], fmt)
    assert enc["input_ids"].shape == (2, 40)  # padded to the longest pair, which fills the budget
    assert enc["attention_mask"][1].sum() < 40  # the short pair is padded
    ids = enc["input_ids"][0].tolist()
    p_ids = roberta_tok(prefix, add_special_tokens=False)["input_ids"]
    d_ids = roberta_tok(passage, add_special_tokens=False)["input_ids"]
    assert ids[1:13] == p_ids[-12:]               # the END of the prefix
    assert ids[15:39] == d_ids[: 40 - 4 - 12]     # the START of the passage
    fixed = encode_pairs(roberta_tok, ["short"], ["tiny"], fmt, padding="max_length")
    assert fixed["input_ids"].shape == (1, 40)
    # Shared prefixes: tokenized once, same result as repeating them.
    shared = encode_pairs(roberta_tok, ["short"], ["tiny", passage], fmt, pair_prefix=[0, 0])
    rep = encode_pairs(roberta_tok, ["short", "short"], ["tiny", passage], fmt)
    torch.testing.assert_close(shared["input_ids"], rep["input_ids"])


def test_input_format_errors_name_the_flag():
    with pytest.raises(ValueError, match="--model.input.max_prefix_tokens"):
        InputFormat(max_length=64, max_prefix_tokens=64)
    with pytest.raises(ValueError, match="--model.input.max_length 512"):
        InputFormat(max_length=600).check_encoder(512, name="roberta-base")


# ------------------------------------------------------------------------------------------ data
def test_validation_split_is_deterministic_by_id():
    from reranking.data import is_validation

    ids = np.arange(5000) * 7 + 3
    a = is_validation(ids, 0.1, seed=0)
    perm = np.random.default_rng(0).permutation(len(ids))
    assert (is_validation(ids[perm], 0.1, seed=0) == a[perm]).all()  # row order does not matter
    assert 0.08 < a.mean() < 0.12
    assert (is_validation(ids, 0.1, seed=1) != a).any()


def test_windows_fall_on_one_side_of_the_validation_split():
    """With m targets per window (ids w*m .. w*m+m-1) a window's examples are all train or all validation;
    m = 1 is the split by id it always was."""
    from reranking.data import is_validation

    ids = np.arange(4000)
    v = is_validation(ids, 0.1, seed=0, per_window=4).reshape(-1, 4)
    assert (v == v[:, :1]).all() and 0.07 < v.mean() < 0.13
    assert (is_validation(ids, 0.1, seed=0, per_window=1) == is_validation(ids, 0.1, seed=0)).all()


def test_data_examples_reads_the_first_n_by_id(rerank_data_dir, tmp_path):
    """--data.examples n: the n examples of smallest id (nested subsets for a learning curve), split as before; m
    is read from the data's config.json; more than the data holds is refused by name."""
    import json
    import shutil

    from reranking.data import RerankDataModule, targets_per_window
    from ralm.settings import SettingsError

    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, examples=20)
    dm.setup()
    full = RerankDataModule(str(rerank_data_dir), val_fraction=0.25)
    full.setup()
    first = sorted(list(full.train_ds["id"]) + list(full.val_ds["id"]))[:20]
    assert sorted(list(dm.train_ds["id"]) + list(dm.val_ds["id"])) == first
    assert set(dm.val_ds["id"]) == set(full.val_ds["id"]) & set(first)  # the subset's split is the whole's
    d = tmp_path / "data"
    shutil.copytree(rerank_data_dir, d)
    (d / "config.json").write_text(json.dumps({"targets": {"per_window": 4}}))
    assert targets_per_window(d) == 4 and targets_per_window(rerank_data_dir) == 1
    with pytest.raises(SettingsError, match="--data.examples 49 exceeds the 48"):
        RerankDataModule(str(rerank_data_dir), examples=49).setup()


def test_collator_pads_candidates_with_mask(roberta_tok, rerank_data_dir):
    from datasets import load_dataset

    from reranking.data import RerankCollator, parquet_files

    ds = load_dataset("parquet", data_files=parquet_files(rerank_data_dir), split="train")
    rows = [ds[i] for i in range(8)]  # rows 0 and 7 have 2 candidates, the others 4
    batch = RerankCollator(roberta_tok, InputFormat(max_length=64, max_prefix_tokens=24))(rows)
    assert batch["mask"].shape == (8, 4) and batch["mask"][0].tolist() == [True, True, False, False]
    assert batch["input_ids"].shape[0] == int(batch["mask"].sum()) == 28
    assert batch["input_ids"].shape[1] <= 64
    torch.testing.assert_close(batch["lm_logprobs"][1], torch.tensor(rows[1]["lm_logprobs"]))
    with pytest.raises(FileNotFoundError, match="data_gen.build"):
        parquet_files(rerank_data_dir / "nope")


def test_lr_schedule_warmup_then_linear_decay(tiny_roberta_dir):
    """The paper's schedule: linear warm-up to the peak lr, then linear decay to 0 at the last step."""
    from reranking.system import Optimizer, RerankerSystem

    system = RerankerSystem(encoder=str(tiny_roberta_dir), pretrained=False,
                            optimizer=Optimizer(lr=1e-3, warmup_steps=10, total_steps=110))
    conf = system.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(111):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(5e-4) and lrs[10] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(5e-4) and lrs[110] == 0.0
    assert max(lrs) == pytest.approx(1e-3)


def test_reciprocal_rank_with_negative_scores_ties_and_padding():
    from reranking.system import reciprocal_rank

    scores = torch.tensor([[-3.0, -1.0, -2.0, -0.5],    # all negative: relevant #2 ranked 2nd
                           [-1.0, -1.0, -1.0, 0.0],     # ties keep candidate order: #2 ranked 4th
                           [-9.0, -5.0, 7.0, -4.0]])    # #3 is padding (never ranked): #0 ranked 3rd
    relevant = torch.tensor([[False, True, False, False], [False, False, True, False], [True, False, True, False]])
    mask = torch.tensor([[True] * 4, [True] * 4, [True, True, False, True]])
    torch.testing.assert_close(reciprocal_rank(scores, relevant, mask), torch.tensor([1 / 2, 1 / 4, 1 / 3]))


def test_validation_mrr_is_at_least_one_over_k(tiny_roberta_dir):
    """Regression: MRR was 0 whenever the reranker's scores were negative (torchmetrics drops preds <= 0)."""
    from reranking.system import RerankerSystem

    system = RerankerSystem(str(tiny_roberta_dir), pretrained=False, input=EncoderInput(max_length=64, max_prefix_tokens=16))
    B, k = 6, 4
    scores = -10.0 - torch.rand(B, k)                       # all negative, as a fresh reranker's often are
    lm = -20.0 * torch.rand(B, k)
    mask = torch.ones(B, k, dtype=torch.bool)
    mask[0, 3] = False
    system.score_batch = lambda batch: scores.masked_fill(~batch["mask"], float("-inf"))
    system.validation_step({"mask": mask, "lm_logprobs": lm, "nodoc_logprob": torch.full((B,), -30.0)}, 0)
    n = system.val_sums["n"].compute()
    mrr = float(system.val_sums["rr"].compute() / n)
    lm_m = lm.masked_fill(~mask, float("-inf"))
    expected = []
    for b in range(B):
        order = sorted(range(k), key=lambda j: -float(scores[b, j]) if mask[b, j] else math.inf)
        expected.append(1.0 / (1 + order.index(int(lm_m[b].argmax()))))
    assert mrr >= 1.0 / k and mrr == pytest.approx(sum(expected) / B)


# ------------------------------------------------------------------------------------------ configs
def test_every_fit_config_parses(capsys, monkeypatch):
    import sys
    from pathlib import Path

    import yaml

    from reranking.data import RerankDataModule
    from reranking.system import RerankerSystem
    from reranking.training import RerankerCLI

    monkeypatch.setattr(sys, "argv", ["reranking.fit"])

    def stack(cfg):  # fit-X.yaml is a change on top of its folder's fit.yaml (LightningCLI stacks --config files)
        base = cfg.with_name("fit.yaml")
        return ["--config", str(base), "--config", str(cfg)] if cfg != base and base.is_file() else ["--config", str(cfg)]

    configs = sorted((Path(__file__).parents[1] / "configs").rglob("*.yaml"))
    targets = [c for c in configs if c.name.startswith("fit") or "reranking.fit" in c.read_text()]
    assert targets, "configs/fit.yaml is missing"
    for cfg in targets:
        with pytest.raises(SystemExit) as e:
            RerankerCLI(RerankerSystem, RerankDataModule, run=False, args=[*stack(cfg), "--print_config"],
                        save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)
        assert e.value.code in (0, None), cfg
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["model"]["encoder"] and "tokenizer" not in printed["data"], cfg  # the model's, read by data
        assert printed["trainer"]["max_steps"] > 0, cfg


def test_pretrained_encoder_starts_in_train_mode(tiny_roberta_dir):
    """from_pretrained returns eval mode and Lightning keeps it: fine-tuning would run without dropout."""
    from reranking.model import CrossEncoder

    model = CrossEncoder(str(tiny_roberta_dir), pretrained=True)
    assert all(m.training for m in model.modules())


def test_init_from_an_export_starts_from_its_weights(tiny_roberta_dir, tmp_path):
    """--model.init_from loads encoder and head of a reranker export (the demo's pretrained start)."""
    from ralm.tiny import make_roberta
    from reranking.export import export_model
    from reranking.system import RerankerSystem

    first = RerankerSystem(str(tiny_roberta_dir), pretrained=True, input=EncoderInput(max_length=64, max_prefix_tokens=24))
    torch.nn.init.normal_(first.model.head.weight, std=1.0)
    export_model(first.model, first.tokenizer, first.fmt, str(tiny_roberta_dir), tmp_path / "start")
    second = RerankerSystem(str(tmp_path / "start"), pretrained=False, input=EncoderInput(max_length=64, max_prefix_tokens=24),
                            init_from=str(tmp_path / "start"))
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(m.training for m in second.model.modules())
    other = tmp_path / "other"
    make_roberta(other, first.tokenizer, num_hidden_layers=1, hidden_size=16, num_attention_heads=2)
    with pytest.raises(ValueError, match="does not fit"):
        RerankerSystem(str(other), pretrained=False, input=EncoderInput(max_length=64, max_prefix_tokens=24),
                       init_from=str(tmp_path / "start"))


def test_fit_help_is_cached_and_identical(tmp_path):
    """``reranking.fit --help`` needs lightning's import once; later calls print the cached text, which
    equals a fresh one (the cache is keyed by this package's source and library versions)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(root)}

    def help_text():
        return subprocess.run([sys.executable, "-m", "reranking.fit", "--help"], cwd=root, env=env,
                              capture_output=True, text=True, check=True).stdout

    first = help_text()
    assert first.startswith("usage: python -m reranking.fit") and "--model.encoder" in first
    assert len(list((tmp_path / "ralm-rerank" / "help").glob("reranking.fit-*.txt"))) == 1
    assert help_text() == first


def test_untrained_bi_encoder_is_the_cosine_ranking(tiny_bert_dir):
    """The bi-encoder before any training scores cosine / τ: the cosine row is exactly its ablation."""
    from ralm.loading import load_tokenizer
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.encoder_selectors import CosineSelector, PredictiveSelector
    from reranking.model import BiEncoder

    fmt = InputFormat(architecture="bi", max_prefix_tokens=20, max_passage_tokens=24)
    model = BiEncoder(str(tiny_bert_dir), pretrained=True, temperature=0.05)
    pred = PredictiveSelector(model, load_tokenizer(str(tiny_bert_dir)), fmt, batch_size=3)
    cos = CosineSelector(str(tiny_bert_dir), input=EncoderInput(max_prefix_tokens=20, max_passage_tokens=24), batch_size=2)
    cands = [[Passage(f"d{i}{j}", f"Title {j}", f"the river {i} and castle {j} " * (j + 1), 0.0) for j in range(n)]
             for i, n in enumerate([4, 0, 2])]
    batch = StrideBatch(prefix_texts=["the castle by the river was " * 5, "x", "a city"], candidates=cands,
                        stride_ids=[0, 1, 2])
    # the bi-encoder selector delegates to CosineSelector: check both against a plain transcription, one
    # text per forward (no padding), of "cosine of mean-pooled, cut, [CLS] ... [SEP]-wrapped texts"
    from transformers import AutoModel, AutoTokenizer

    enc, tok = AutoModel.from_pretrained(str(tiny_bert_dir)).eval(), AutoTokenizer.from_pretrained(str(tiny_bert_dir))

    def embed(text, max_tokens, keep_end):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ids = ids[-(max_tokens - 2):] if keep_end else ids[:max_tokens - 2]
        with torch.no_grad():
            h = enc(input_ids=torch.tensor([[tok.cls_token_id, *ids, tok.sep_token_id]])).last_hidden_state[0]
        return torch.nn.functional.normalize(h.mean(0), dim=0)

    want = [torch.tensor([float(embed(p.document(), 24, False) @ embed(x, 20, True)) for p in c])
            for x, c in zip(batch.prefix_texts, cands)]
    for a, b, w in zip(pred.scores(batch), cos.scores(batch), want):
        torch.testing.assert_close(b, w, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a * 0.05, w, rtol=1e-4, atol=1e-5)
    assert pred.select(batch) == cos.select(batch) == [int(w.argmax()) if len(w) else -1 for w in want]


def test_bi_encoder_collator_and_format_checks(tiny_bert_dir, rerank_data_dir):
    from datasets import load_dataset

    from ralm.loading import load_tokenizer
    from ralm.settings import SettingsError
    from reranking.data import RerankCollator, parquet_files

    tok = load_tokenizer(str(tiny_bert_dir))
    ds = load_dataset("parquet", data_files=parquet_files(rerank_data_dir), split="train")
    rows = [ds[i] for i in range(6, 9)]  # row 7 has 2 candidates, the others 4
    fmt = InputFormat(architecture="bi", max_prefix_tokens=16, max_passage_tokens=20)
    batch = RerankCollator(tok, fmt)(rows)
    n = [len(r["doc_texts"]) for r in rows]
    assert batch["query_input_ids"].shape[0] == 3 and batch["query_input_ids"].shape[1] <= 16
    assert batch["passage_input_ids"].shape[0] == sum(n) and batch["passage_input_ids"].shape[1] <= 20
    assert batch["pair_query"].tolist() == [b for b, k in enumerate(n) for _ in range(k)]
    assert InputFormat.from_dict({"max_length": 64, "max_prefix_tokens": 24}).architecture == "cross"  # old exports
    with pytest.raises(SettingsError, match="--model.architecture"):
        InputFormat(architecture="poly")
    with pytest.raises(SettingsError, match="max_passage_tokens=600 exceeds"):
        InputFormat(architecture="bi", max_passage_tokens=600).check_encoder(512)


@pytest.mark.parametrize("architecture", ["bi", "cross"])
def test_bm25_prior_is_added_alike_in_training_and_evaluation(tiny_bert_dir, rerank_data_dir, tmp_path, architecture):
    """score = f(x, d) + w × BM25(x, d): the training batch's scores (RerankerSystem.score_batch on the
    collator's ``bm25``) and the exported selector's (``Passage.score``) are the text-only scores plus the
    same prior, and the weight survives the export."""
    from datasets import load_dataset

    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.data import RerankDataModule, parquet_files
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import export
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture=architecture,
              input=EncoderInput(max_length=48, max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)
    plain = RerankerSystem(**kw).eval()
    prior = RerankerSystem(**kw, bm25_weight=0.5).eval()
    prior.model.load_state_dict(plain.model.state_dict())
    # the batch comes through the data module, as in reranking.fit (which once dropped bm25_scores)
    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, batch_size=4,
                          num_workers=0).reading(str(tiny_bert_dir), plain.fmt)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    by_id = {r["id"]: r for r in load_dataset("parquet", data_files=parquet_files(rerank_data_dir), split="train")}
    rows = [by_id[int(i)] for i in batch["ids"]]
    assert len(rows) == 4 and "bm25" in batch
    bm25 = torch.full(batch["mask"].shape, float("-inf"))
    for b, r in enumerate(rows):
        bm25[b, : len(r["bm25_scores"])] = torch.tensor(r["bm25_scores"])
    with torch.no_grad():
        want = plain.score_batch(batch) + 0.5 * bm25      # -inf stays on padding
        torch.testing.assert_close(prior.score_batch(batch), want)
    sel = PredictiveSelector.from_path(export(prior, tmp_path / "export"), batch_size=3)
    assert sel.fmt.bm25_weight == 0.5
    cands = [[Passage(f"d{j}", "", t, s) for j, (t, s) in enumerate(zip(r["doc_texts"], r["bm25_scores"]))] for r in rows]
    got = sel.scores(StrideBatch([r["prefix_text"] for r in rows], cands, list(range(len(rows)))))
    for b, g in enumerate(got):
        torch.testing.assert_close(g, want[b, : len(g)], rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="bm25_weight"):
        InputFormat(bm25_weight=-1.0)
    with pytest.raises(ValueError, match="bm25_scores column"):
        prior.score_batch({k: v for k, v in batch.items() if k != "bm25"})


def test_passage_grad_false_trains_through_the_prefix_only(tiny_bert_dir, rerank_data_dir):
    """``passage_grad: false`` gives the same scores and exactly the gradient of a plain transcription
    in which the passages' embeddings are constants; the default's gradient differs (it is not a no-op)."""
    from ralm.settings import SettingsError
    from reranking.data import RerankDataModule
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture="bi", bm25_weight=0.5,
              input=EncoderInput(max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)
    full = RerankerSystem(**kw)
    query_side = RerankerSystem(**kw, passage_grad=False)
    query_side.model.load_state_dict(full.model.state_dict())
    for s in (full, query_side):
        s.model.eval()  # no dropout: the three gradients below must see the same forward
    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, batch_size=4,
                          num_workers=0).reading(str(tiny_bert_dir), InputFormat.of(kw["input"], "bi"))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))

    def grads(system, scores):
        system.model.zero_grad()
        system.loss_fn(scores, batch["lm_logprobs"], batch["mask"]).backward()
        return {n: p.grad.clone() for n, p in system.model.named_parameters() if p.grad is not None}

    got_scores = query_side.score_batch(batch)
    torch.testing.assert_close(got_scores, full.score_batch(batch))
    got = grads(query_side, got_scores)
    m = full.model  # the transcription: embed both sides, detach the passages' embeddings
    q = m.embed(batch["query_input_ids"], batch["query_attention_mask"])
    d = m.embed(batch["passage_input_ids"], batch["passage_attention_mask"]).detach()
    f = (q[batch["pair_query"]] * d).sum(-1) / m.temperature
    mask = batch["mask"]
    scores = torch.full(mask.shape, float("-inf")).masked_scatter(mask, f) + 0.5 * batch["bm25"]
    want = grads(full, scores)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=n)
    both = grads(full, full.score_batch(batch))
    assert any(not torch.allclose(both[n], want[n]) for n in want)
    with pytest.raises(SettingsError, match="passage_grad"):
        RerankerSystem(encoder=str(tiny_bert_dir), architecture="cross", input=EncoderInput(max_length=48, max_prefix_tokens=16),
                       passage_grad=False)


def test_frozen_passages_trains_the_prefix_tower_against_the_starting_encoders_passages(
        tiny_bert_dir, rerank_data_dir, tmp_path):
    """``frozen_passages``: untrained it scores as the shared model; its gradient is a plain transcription's
    with the passages embedded by a detached copy of the start; after training steps the passages keep the
    start's embeddings (each distinct passage computed once), and the export carries both towers."""
    from datasets import load_dataset

    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from ralm.settings import SettingsError
    from reranking.data import RerankDataModule, parquet_files
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import export
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture="bi", bm25_weight=0.5,
              input=EncoderInput(max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)
    shared = RerankerSystem(**kw)
    frozen = RerankerSystem(**kw, frozen_passages=True)
    frozen.model.load_state_dict({**shared.model.state_dict(),
                                  **{f"passage_encoder.{k}": v for k, v in shared.model.encoder.state_dict().items()}})
    start = copy.deepcopy(shared.model.encoder).eval()
    frozen.model.train()
    assert frozen.model.encoder.training and not frozen.model.passage_encoder.training
    assert not any(p.requires_grad for p in frozen.model.passage_encoder.parameters())
    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, batch_size=4,
                          num_workers=0).reading(str(tiny_bert_dir), InputFormat.of(kw["input"], "bi"))
    dm.setup("fit")
    batches = list(dm.train_dataloader())[:3]
    for s in (shared, frozen):
        s.model.encoder.eval()  # no dropout: the forwards compared below must be the same
    with torch.no_grad():
        torch.testing.assert_close(frozen.score_batch(batches[0]), shared.score_batch(batches[0]))

    def transcription(batch):  # the prefixes by the trained tower, the passages by the start, as constants
        q = frozen.model.embed(batch["query_input_ids"], batch["query_attention_mask"])
        with torch.no_grad():
            h = start(input_ids=batch["passage_input_ids"], attention_mask=batch["passage_attention_mask"])
            m = batch["passage_attention_mask"].unsqueeze(-1).float()
            d = torch.nn.functional.normalize((h.last_hidden_state * m).sum(1) / m.sum(1), dim=-1)
        f = (q[batch["pair_query"]] * d).sum(-1) / frozen.model.temperature
        mask = batch["mask"]
        return torch.full(mask.shape, float("-inf")).masked_scatter(mask, f) + 0.5 * batch["bm25"]

    opt = torch.optim.SGD([p for p in frozen.model.parameters() if p.requires_grad], lr=0.5)
    for batch in batches:  # train the prefix tower: a passage's embedding must not move
        frozen.model.zero_grad()
        frozen.loss_fn(frozen.score_batch(batch), batch["lm_logprobs"], batch["mask"]).backward()
        got = {n: p.grad.clone() for n, p in frozen.model.named_parameters() if p.grad is not None}
        frozen.model.zero_grad()
        frozen.loss_fn(transcription(batch), batch["lm_logprobs"], batch["mask"]).backward()
        want = {n: p.grad.clone() for n, p in frozen.model.named_parameters() if p.grad is not None}
        assert got.keys() == want.keys() and not any(n.startswith("passage_encoder.") for n in got)
        for n in want:
            torch.testing.assert_close(got[n], want[n], msg=n)
        opt.step()
    distinct = {tuple(ids[m.bool()].tolist()) for b in batches
                for ids, m in zip(b["passage_input_ids"], b["passage_attention_mask"])}
    assert len(frozen.model._frozen) == len(distinct)
    with torch.no_grad():
        trained = frozen.score_batch(batches[0])
        torch.testing.assert_close(trained, transcription(batches[0]))
        assert not torch.allclose(trained, shared.score_batch(batches[0]))
    sel = PredictiveSelector.from_path(export(frozen, tmp_path / "export"), batch_size=3)
    assert sel.model.frozen_passages and not sel.model._frozen  # loading new weights empties the cache
    by_id = {r["id"]: r for r in load_dataset("parquet", data_files=parquet_files(rerank_data_dir), split="train")}
    rows = [by_id[int(i)] for i in batches[0]["ids"]]
    cands = [[Passage(f"d{j}", "", t, s) for j, (t, s) in enumerate(zip(r["doc_texts"], r["bm25_scores"]))] for r in rows]
    got = sel.scores(StrideBatch([r["prefix_text"] for r in rows], cands, list(range(len(rows)))))
    for b, g in enumerate(got):
        torch.testing.assert_close(g, trained[b, : len(g)], rtol=1e-4, atol=1e-4)
    with pytest.raises(SettingsError, match="frozen_passages"):
        RerankerSystem(encoder=str(tiny_bert_dir), architecture="cross", input=EncoderInput(max_length=48, max_prefix_tokens=16),
                       frozen_passages=True)


def test_attention_dropout_replaces_the_encoders_own(tiny_bert_dir):
    """``attention_dropout`` reaches the config and every self-attention module (the one dropout whose
    mask is drawn over [heads, T, T]); the encoder's other dropout and its pretrained weights are kept."""
    from ralm.settings import SettingsError
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture="bi", input=EncoderInput(max_prefix_tokens=16, max_passage_tokens=24))
    own, none = RerankerSystem(**kw), RerankerSystem(**kw, attention_dropout=0.0)
    assert own.model.config.attention_probs_dropout_prob > 0 and none.model.config.attention_probs_dropout_prob == 0
    attn = [m.dropout.p for n, m in none.model.named_modules() if n.endswith("attention.self")]
    assert attn and all(p == 0 for p in attn)
    assert none.model.config.hidden_dropout_prob == own.model.config.hidden_dropout_prob
    for (n, a), b in zip(own.model.state_dict().items(), none.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=n)
    with pytest.raises(SettingsError, match="--model.attention_dropout"):
        RerankerSystem(**kw, attention_dropout=1.5)


@pytest.mark.parametrize("architecture", ["bi", "cross"])
def test_hidden_dropout_replaces_the_encoders_own(tiny_bert_dir, architecture):
    """``hidden_dropout`` reaches the config and every dropout on hidden states, leaving attention's own and
    the weights; with both at 0 a training-mode forward equals an eval-mode one (no mask drawn anywhere)."""
    from ralm.settings import SettingsError
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture=architecture,
              input=EncoderInput(max_length=48, max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)  # the cross-encoder's head is drawn: the same seed gives both the same head
    own = RerankerSystem(**kw)
    torch.manual_seed(0)
    none = RerankerSystem(**kw, hidden_dropout=0.0)
    assert own.model.config.hidden_dropout_prob > 0 and none.model.config.hidden_dropout_prob == 0
    assert none.model.config.attention_probs_dropout_prob == own.model.config.attention_probs_dropout_prob > 0
    hidden = [m.p for n, m in none.model.named_modules()
              if isinstance(m, torch.nn.Dropout) and not n.endswith("attention.self.dropout")]
    assert hidden and all(p == 0 for p in hidden)
    for (n, a), b in zip(own.model.state_dict().items(), none.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=n)
    off = RerankerSystem(**kw, hidden_dropout=0.0, attention_dropout=0.0)
    off.model.load_state_dict(own.model.state_dict())
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.ones_like(ids)
    encoder = off.model.encoder
    encoder.train()
    trained = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    encoder.eval()
    torch.testing.assert_close(trained, encoder(input_ids=ids, attention_mask=mask).last_hidden_state)
    own.model.encoder.train()
    assert not torch.allclose(own.model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state, trained)
    with pytest.raises(SettingsError, match="--model.hidden_dropout"):
        RerankerSystem(**kw, hidden_dropout=-0.1)


@pytest.mark.parametrize("architecture", ["bi", "cross"])
def test_dropped_strings_are_unread_alike_in_training_and_evaluation(tiny_bert_dir, tmp_path, architecture):
    """``drop`` (WikiText-2 train's ``<unk>``): the collator's batch and the exported selector's scores equal
    those of the same model without ``drop`` reading the texts with the strings removed by hand, and the
    setting survives the export."""
    from ralm.loading import load_tokenizer
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.data import RerankCollator
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import export
    from reranking.system import RerankerSystem

    rows = [{"id": 0, "prefix_text": "the <unk> river flows <unk>", "doc_texts": ["A\nan <unk> bank", "B\nclear water"],
             "lm_logprobs": [-3.0, -2.0], "bm25_scores": [4.0, 3.0]},
            {"id": 1, "prefix_text": "a quiet town", "doc_texts": ["C\n<unk><unk> street", "D\nthe town <unk>"],
             "lm_logprobs": [-1.0, -5.0], "bm25_scores": [2.0, 1.5]}]

    def strip(t):
        return t.replace("<unk>", "")

    by_hand = [{**r, "prefix_text": strip(r["prefix_text"]), "doc_texts": [strip(d) for d in r["doc_texts"]]}
               for r in rows]
    kw = dict(encoder=str(tiny_bert_dir), architecture=architecture, bm25_weight=0.5,
              input=EncoderInput(max_length=48, max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)
    blind = RerankerSystem(**{**kw, "input": EncoderInput(max_length=48, max_prefix_tokens=16, max_passage_tokens=24,
                                                          drop=["<unk>"])}).eval()
    plain = RerankerSystem(**kw).eval()
    plain.model.load_state_dict(blind.model.state_dict())
    tok = load_tokenizer(str(tiny_bert_dir))
    got, want = RerankCollator(tok, blind.fmt)(rows), RerankCollator(tok, plain.fmt)(by_hand)
    assert got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], equal_nan=True)
    assert not torch.equal(RerankCollator(tok, plain.fmt)(rows)[next(iter(got))], want[next(iter(got))])

    sel = PredictiveSelector.from_path(export(blind, tmp_path / "export"), batch_size=3)
    assert sel.fmt.drop == ("<unk>",)
    ref = PredictiveSelector.from_path(export(plain, tmp_path / "plain"), batch_size=3)

    def stride_batch(rs):
        return StrideBatch([r["prefix_text"] for r in rs],
                           [[Passage(f"d{j}", "", t, s) for j, (t, s) in enumerate(zip(r["doc_texts"], r["bm25_scores"]))]
                            for r in rs], [0, 1])

    for g, w in zip(sel.scores(stride_batch(rows)), ref.scores(stride_batch(by_hand))):
        torch.testing.assert_close(g, w)
    with pytest.raises(Exception, match="drop"):
        InputFormat(drop=("",))
    assert InputFormat.from_dict(InputFormat(drop=["<unk>"]).to_dict()).drop == ("<unk>",)


@pytest.mark.parametrize("architecture", ["bi", "cross"])
def test_a_reranker_that_may_abstain_ranks_no_passage_alike_in_training_and_evaluation(
        tiny_bert_dir, rerank_data_dir, tmp_path, architecture):
    """``abstain``: every list ends with "no passage" (the empty text, BM25's first score as its prior, the
    LM's log p(y | x) as its target); the loss is the plain expected NLL over the k + 1; the exported selector
    scores the list as the training batch did, chooses -1 where "no passage" scores highest, and its rank()
    places it as -1. Trained where no passage is always best, it learns to take none."""
    import lightning.pytorch as pl
    import pyarrow.parquet as pq
    from datasets import load_dataset

    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.data import RerankDataModule, parquet_files
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import export
    from reranking.system import Optimizer, RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture=architecture, bm25_weight=0.5, loss="expected",
              input=EncoderInput(max_length=48, max_prefix_tokens=16, max_passage_tokens=24), abstain=True)
    torch.manual_seed(0)
    system = RerankerSystem(**kw).eval()
    dm = RerankDataModule(str(rerank_data_dir), val_fraction=0.25, batch_size=4,
                          num_workers=0).reading(str(tiny_bert_dir), system.fmt)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    by_id = {r["id"]: r for r in load_dataset("parquet", data_files=parquet_files(rerank_data_dir), split="train")}
    rows = [by_id[int(i)] for i in batch["ids"]]
    for b, r in enumerate(rows):
        n = len(r["doc_texts"])
        assert int(batch["mask"][b].sum()) == n + 1
        assert float(batch["lm_logprobs"][b, n]) == pytest.approx(r["nodoc_logprob"])
        assert float(batch["bm25"][b, n]) == pytest.approx(r["bm25_scores"][0])
    with torch.no_grad():
        scores = system.score_batch(batch)
        loss = float(system.loss_fn(scores, batch["lm_logprobs"], batch["mask"]))
    plain = []
    for b, r in enumerate(rows):
        s = scores[b, : len(r["doc_texts"]) + 1].double()
        targets = torch.tensor([*r["lm_logprobs"], r["nodoc_logprob"]], dtype=torch.float64)
        plain.append(float((torch.softmax(s, 0) * -targets).sum()))
    assert loss == pytest.approx(sum(plain) / len(plain), rel=1e-5)
    sel = PredictiveSelector.from_path(export(system, tmp_path / "export"), batch_size=3)
    assert sel.fmt.abstain and sel.abstains
    cands = [[Passage(f"d{j}", "", t, s) for j, (t, s) in enumerate(zip(r["doc_texts"], r["bm25_scores"]))] for r in rows]
    strides = StrideBatch([r["prefix_text"] for r in rows], cands, list(range(len(rows))))
    got = sel.scores(strides)
    for b, g in enumerate(got):
        torch.testing.assert_close(g, scores[b, : len(g)], rtol=1e-4, atol=1e-4)
    assert sel.select(strides) == [int(g.argmax()) if int(g.argmax()) < len(c) else -1 for g, c in zip(got, cands)]
    s, order = sel.rank(rows[0]["prefix_text"], cands[0])
    assert sorted(order) == [-1, *range(len(cands[0]))] and [s[j] for j in order] == sorted(s, reverse=True)

    # no passage always best by 20 nats: training moves the choice to it
    best = tmp_path / "none-best"
    best.mkdir()
    for f in parquet_files(rerank_data_dir):
        t = pq.read_table(f).to_pylist()
        for r in t:
            r["nodoc_logprob"] = max(r["lm_logprobs"]) + 20.0
        pq.write_table(pq.read_table(f).from_pylist(t, schema=pq.read_table(f).schema), best / f.split("/")[-1])
    torch.manual_seed(0)
    learner = RerankerSystem(**kw, optimizer=Optimizer(lr=1e-3, warmup_steps=0, total_steps=60))
    data = RerankDataModule(str(best), val_fraction=0.25, batch_size=4, num_workers=0).reading(str(tiny_bert_dir),
                                                                                               learner.fmt)
    data.setup("fit")

    def abstains() -> float:  # the share of validation examples whose choice is no passage (each list's last)
        learner.eval()
        with torch.no_grad():
            picks = [(int(sc[:int(m.sum())].argmax()), int(m.sum()) - 1)
                     for b in data.val_dataloader() for sc, m in zip(learner.score_batch(b), b["mask"])]
        return sum(p == last for p, last in picks) / len(picks)

    before = abstains()
    pl.Trainer(max_steps=60, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=0).fit(learner, datamodule=data)
    assert before < 0.5 and abstains() >= 0.9, before


def test_rerankers_with_one_passage_tower_embed_each_passage_once(tiny_bert_dir, tmp_path):
    """Two query-side rerankers (one frozen passage tower, different prefix towers) judged together share
    their passage embeddings: the second embeds no passage, and scores exactly as it does alone."""
    from ralm.retrieval import Passage
    from ralm.selectors import StrideBatch
    from reranking.encoder_selectors import PredictiveSelector
    from reranking.export import export
    from reranking.system import RerankerSystem

    kw = dict(encoder=str(tiny_bert_dir), architecture="bi", frozen_passages=True,
              input=EncoderInput(max_prefix_tokens=16, max_passage_tokens=24))
    torch.manual_seed(0)
    a = RerankerSystem(**kw)
    b = RerankerSystem(**kw)
    b.model.load_state_dict(a.model.state_dict())
    with torch.no_grad():
        for w in b.model.encoder.parameters():  # another prefix tower, the same passage tower
            w.add_(0.05 * torch.randn_like(w))
    paths = [export(s, tmp_path / name) for s, name in ((a, "a"), (b, "b"))]
    batch = StrideBatch(["the castle on the hill", "a river in spring"],
                        [[Passage(f"d{i}", "T", f"passage number {i} about towns", 1.0) for i in range(3)]] * 2, [0, 1])
    alone = PredictiveSelector.from_path(paths[1], batch_size=4).scores(batch)
    caches: dict = {}
    first, second = (PredictiveSelector.from_path(p, batch_size=4) for p in paths)
    first.share_passage_embeddings(caches)
    second.share_passage_embeddings(caches)
    first.scores(batch)
    calls = []
    embed = second._cosine.embed
    second._cosine.embed = lambda texts, *args, **kw: calls.append((len(texts), kw.get("passages"))) or embed(texts, *args, **kw)
    got = second.scores(batch)
    assert len(caches) == 1 and not [n for n, passages in calls if passages and n]  # prefixes embedded, no passage
    for g, want in zip(got, alone):
        torch.testing.assert_close(g, want)
    assert not torch.allclose(got[0], first.scores(batch)[0])  # the prefix towers differ
