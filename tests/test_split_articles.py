"""bench/split_articles.py: every example lands on exactly one side, whole articles at a time."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.split_articles import heldout_titles, split, split_text


def _shards(d, titles_per_shard):
    d.mkdir()
    next_id = 0
    for s, titles in enumerate(titles_per_shard):
        ids = list(range(next_id, next_id + len(titles)))
        next_id += len(titles)
        pq.write_table(pa.table({"id": ids, "source_title": titles, "prefix_text": [f"p{i}" for i in ids]}),
                       d / f"train-{s:05d}-of-{len(titles_per_shard):05d}.parquet")


def _rows(d):
    return [r for f in sorted(d.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_split_partitions_examples_by_article(tmp_path):
    titles = [f"Article {i}" for i in range(40)]
    _shards(tmp_path / "data", [titles[:30] + titles[:5], titles[10:] + titles[20:25]])  # articles span shards
    rec = split(tmp_path / "data", tmp_path / "fit", tmp_path / "held", fraction=0.5, seed=0)
    fit, held = _rows(tmp_path / "fit"), _rows(tmp_path / "held")
    assert sorted(r["id"] for r in fit + held) == [r["id"] for r in _rows(tmp_path / "data")]
    assert not {r["source_title"] for r in fit} & {r["source_title"] for r in held}
    assert fit and held  # 40 articles at 0.5: both sides non-empty
    expect = heldout_titles([r["source_title"] for r in held + fit], 0.5, 0)
    assert expect.tolist() == [True] * len(held) + [False] * len(fit)
    assert rec["examples"] == {"fit": len(fit), "heldout": len(held)}
    assert json.loads((tmp_path / "held" / "split.json").read_text()) == rec


def test_split_is_deterministic_and_seeded():
    titles = [f"T{i}" for i in range(200)]
    a, b = heldout_titles(titles, 0.3, 0), heldout_titles(titles, 0.3, 1)
    assert (a == heldout_titles(titles, 0.3, 0)).all() and (a != b).any()
    assert 0.15 < a.mean() < 0.45


def test_split_refuses_a_non_empty_output(tmp_path):
    _shards(tmp_path / "data", [["A", "B"]])
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "x.parquet").write_text("")
    with pytest.raises(SystemExit, match="not empty"):
        split(tmp_path / "data", tmp_path / "fit", tmp_path / "held", 0.5, 0)


def test_split_text_keeps_whole_articles_on_the_side_the_dataset_split_gives_their_title(tmp_path):
    from ralm.corpus import split_articles

    arts = [f" = Article {i} = \n \n Body {i} , one line .\n \n = = Section = = \n \n More of {i} .\n \n" for i in range(30)]
    text = " \n" + "".join(arts)  # a blank lead before the first heading belongs to no article
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    rec = split_text(tmp_path / "train.txt", tmp_path / "fit.txt", tmp_path / "held.txt", fraction=0.5, seed=0)
    held = heldout_titles([f"Article {i}" for i in range(30)], 0.5, 0)
    for f, side in (("fit.txt", False), ("held.txt", True)):
        pieces, titles = split_articles((tmp_path / f).read_text(encoding="utf-8"))
        assert titles == [f"Article {i}" for i in range(30) if held[i] == side]  # whole, in order, as read back
        assert pieces == [arts[i] for i in range(30) if held[i] == side]
    assert rec["articles"] == {"fit": int((~held).sum()), "heldout": int(held.sum())} and 0 < held.sum() < 30
    with pytest.raises(SystemExit, match="exists"):
        split_text(tmp_path / "train.txt", tmp_path / "fit.txt", tmp_path / "other.txt", fraction=0.5, seed=0)
