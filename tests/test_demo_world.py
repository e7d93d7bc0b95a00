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
    assert main(["--out", str(tmp_path), "--train_articles", "3", "--eval_articles", "2"]) == 0
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


def test_dev_and_heldout_texts_leave_the_rest_unchanged(world):
    """Asking for dev and held-out articles adds texts of new events and changes nothing else."""
    more = make_world(seed=0, n_train_articles=40, n_eval_articles=30, n_dev_articles=3, n_heldout_articles=4)
    assert more.corpus == world.corpus and more.train_text == world.train_text and more.eval_text == world.eval_text
    assert len(headings(more.dev_text)) == 3 and len(headings(more.heldout_text)) == 4
    seen = set(headings(world.eval_text)) | set(headings(world.train_text)) | {t for t, _ in world.corpus}
    assert not (set(headings(more.dev_text)) | set(headings(more.heldout_text))) & seen
    assert not set(headings(more.dev_text)) & set(headings(more.heldout_text))
