"""The demo's synthetic world (demo/world.py) and the committed small LM (demo/assets/lm)."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import pytest

from demo.world import headings, main, make_world, mentions

LM_DIR = Path(__file__).resolve().parents[1] / "demo" / "assets" / "lm"


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0, n_train_articles=40, n_eval_articles=30)


def test_world_is_deterministic(world):
    again = make_world(seed=0, n_train_articles=40, n_eval_articles=30)
    assert again.corpus == world.corpus
    assert again.train_text == world.train_text and again.eval_text == world.eval_text
    other = make_world(seed=1, n_train_articles=40, n_eval_articles=30)
    assert other.corpus != world.corpus and other.eval_text != world.eval_text


def test_world_layout_and_near_duplicates(world):
    titles = {t for t, _ in world.corpus}
    assert len(titles) == len(world.corpus)
    assert all(len(text.split()) <= 100 for _, text in world.corpus)  # one corpus article = one passage
    for text in (world.train_text, world.eval_text):
        assert text.startswith(" \n = ") and text.endswith(" \n")
        heads = headings(text)
        assert heads and not titles & set(heads)  # event headings are never corpus titles (METHOD §4)
    # people named in the evaluation text never appear in the training text
    names = [p.name for p in world.people]
    in_eval = {n for _, n in mentions(world.eval_text, names)}
    in_train = {n for _, n in mentions(world.train_text, names)}
    assert in_eval and in_train and not in_eval & in_train
    # near-duplicates: shared first names, shared surnames (siblings), shared towns
    people = world.people
    assert len({p.first for p in people}) < len(people) / 10
    assert sum(bool(p.siblings) for p in people) > len(people) / 2
    assert len({p.town for p in people}) < len(people) / 10


def test_cli_writes_files(tmp_path):
    main(["--out", str(tmp_path), "--train-articles", "3", "--eval-articles", "2"])
    rows = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    assert rows and all(r["contents"] == f"{r['title']}\n{r['text']}" for r in rows)
    corpus_txt = (tmp_path / "corpus.txt").read_text()
    assert headings(corpus_txt) == [r["title"] for r in rows]
    assert len(headings((tmp_path / "eval.txt").read_text())) == 2
    assert len(headings((tmp_path / "train.txt").read_text())) == 3


def test_committed_lm_loads_and_reads_its_documents(world):
    """The committed weights load by the real path and the right passage lowers NLL (it can fail)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = list(LM_DIR.glob("*.safetensors"))
    assert files, f"no committed weights in {LM_DIR}"
    assert sum(f.stat().st_size for f in LM_DIR.iterdir()) < 20 * 2**20
    tok = AutoTokenizer.from_pretrained(LM_DIR)
    model = AutoModelForCausalLM.from_pretrained(LM_DIR).eval().float()
    L, S, BUDGET = min(256, model.config.n_positions), 4, 96

    text = world.eval_text
    enc = tok(text, return_offsets_mapping=True)
    ids = enc["input_ids"]
    tok_end = [e for _, e in enc["offset_mapping"]]
    people = {p.name: p for p in world.people}
    marks = [(bisect.bisect_left(tok_end, c), n) for c, n in mentions(text, people)]
    docs = {t: tok(f"{t}\n{x}")["input_ids"][:BUDGET] for t, x in world.corpus}

    rows = {"none": [], "right": [], "wrong": []}
    for end in range(L + S, len(ids) + 1, 5 * S)[:40]:  # 40 strided target blocks
        j = bisect.bisect_right([m for m, _ in marks], end - S) - 1  # last mention completed before the targets
        cur = people[marks[j][1]]
        wrong = cur.siblings[0] if cur.siblings else cur.town
        for key, doc in (("none", []), ("right", docs[cur.name]), ("wrong", docs[wrong])):
            rows[key].append(doc + ids[end - (L - len(doc)):end])

    nll = {}
    with torch.no_grad():
        for key, r in rows.items():
            x = torch.tensor(r)
            lp = model(input_ids=x).logits[:, -S - 1:-1].float().log_softmax(-1)
            nll[key] = -lp.gather(-1, x[:, -S:, None]).mean().item()
    # measured when committed: none 1.42, right 1.23, wrong 1.41 nats/token (a random LM: all equal)
    assert nll["right"] < 0.92 * nll["none"], nll  # documents help
    assert nll["right"] < nll["wrong"] - 0.05, nll  # and it is the right document that helps


def test_eval_people_in_train_changes_only_the_training_text(world):
    shared = make_world(seed=0, n_train_articles=40, n_eval_articles=30, eval_people_in_train=True)
    assert shared.corpus == world.corpus and shared.eval_text == world.eval_text
    names = [p.name for p in world.people]
    in_eval = {n for _, n in mentions(shared.eval_text, names)}
    in_train = {n for _, n in mentions(shared.train_text, names)}
    assert in_eval & in_train


def test_committed_encoder_covers_the_demo_world():
    """The pretrained demo encoder loads as a reranker encoder and has a token for every name and town."""
    from demo.world import world_from_config
    from reranking.export import load_reranker

    model, tok, fmt = load_reranker(LM_DIR.parent / "encoder")
    assert model.config.vocab_size == len(tok) and fmt.max_length == 96
    w = world_from_config(LM_DIR.parents[2] / "configs" / "demo" / "world.yaml")
    words = {x for t, _ in w.corpus for x in t.split()}
    ids = tok(" ".join(sorted(words)), add_special_tokens=False)["input_ids"]
    assert len(ids) == len(words) and tok.unk_token_id not in ids


def test_encoder_pretraining_writes_an_export_and_continues_from_one(tmp_path):
    """``demo.encoder`` saves a loadable reranker export; ``--init-from`` starts from that export's weights."""
    import torch

    from demo.encoder import main as pretrain_main
    from reranking.export import load_reranker

    cfg = tmp_path / "world.yaml"
    cfg.write_text("seed: 0\ntrain-articles: 30\neval-articles: 2\n")
    first, second = tmp_path / "stage1", tmp_path / "stage2"
    common = ["--world-config", str(cfg), "--max-length", "48", "--max-prefix-tokens", "16", "--hidden", "16",
              "--heads", "2"]
    pretrain_main(["--out", str(first), "--random-steps", "2", "--hard-steps", "1", *common])
    pretrain_main(["--out", str(second), "--init-from", str(first), "--random-steps", "0", "--hard-steps", "0",
                   *common])
    a, tok_a, fmt_a = load_reranker(first)
    b, tok_b, fmt_b = load_reranker(second)
    assert fmt_a == fmt_b and tok_a.get_vocab() == tok_b.get_vocab()
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name  # no updates: the continuation is exactly its start
    pretrain_main(["--out", str(second), "--init-from", str(first), "--random-steps", "0", "--hard-steps", "1",
                   *common])
    c = load_reranker(second)[0]
    assert any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))
