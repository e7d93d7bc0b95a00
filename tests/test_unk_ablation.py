"""bench/unk_ablation.py's Blind: the reranker reads stripped texts, the picks and the LM's passages are untouched."""

from bench.unk_ablation import Blind
from ralm.retrieval import Passage
from ralm.selectors import StrideBatch


class Recorder:
    uses_documents = True

    def __init__(self):
        self.seen, self.device = None, None

    def to(self, device):
        self.device = device
        return self

    def select(self, batch, lm_nll=None):
        self.seen = batch
        return [len(c) - 1 for c in batch.candidates]


def test_blind_strips_what_the_reranker_reads_only():
    cands = [[Passage("1", "A", "x <unk> y", 3.0), Passage("2", "B", "z", 1.0, contents="B\nz <unk>")]]
    batch = StrideBatch(["the <unk> prefix"], cands, [7])
    inner = Recorder()
    blind = Blind(inner, ["<unk>"])
    assert blind.select(batch) == [1]
    assert inner.seen.prefix_texts == ["the  prefix"] and inner.seen.stride_ids == [7]
    assert [p.document() for p in inner.seen.candidates[0]] == ["A\nx  y", "B\nz "]
    assert [p.score for p in inner.seen.candidates[0]] == [3.0, 1.0]
    assert batch.prefix_texts == ["the <unk> prefix"] and cands[0][0].text == "x <unk> y"  # the LM's inputs as stored
    assert blind.uses_documents and blind.to("cpu") is blind and inner.device == "cpu"
