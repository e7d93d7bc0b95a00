"""``demo.run``'s seeds: which directories and rows each seed gets, and the one-seed run's reuse."""

from __future__ import annotations

import json

import pytest

from demo.run import reuse_config_seed, seed_names
from eval.compare import mean_of_seeds
from ralm.settings import SettingsError


def test_the_config_seed_alone_keeps_the_plain_names():
    assert seed_names([0], 0) == {0: ("reranker", "predictive")}
    assert seed_names([3], 0) == {3: ("reranker-seed3", "predictive-seed3")}  # `reranker/` is always the config's seed
    assert seed_names([0, 1, 2], 0) == {s: (f"reranker-seed{s}", f"predictive-seed{s}") for s in (0, 1, 2)}


@pytest.mark.parametrize("bad", [[], [1, 1]])
def test_seeds_must_be_distinct_and_given(bad):
    with pytest.raises(SettingsError, match="--seeds"):
        seed_names(bad, 0)


def test_the_mean_of_seeds_is_the_geometric_mean():
    """What demo.run checks the ordering on when there are several seeds: the tables' mean-of-seeds row."""
    assert mean_of_seeds([4.7, 4.9, 4.5]) == pytest.approx((4.7 * 4.9 * 4.5) ** (1 / 3), rel=1e-12)
    assert mean_of_seeds([5.0]) == pytest.approx(5.0, rel=1e-15)


def test_a_plain_demo_runs_reranker_and_rows_are_reused_as_the_config_seeds(tmp_path):
    (tmp_path / "reranker").mkdir()
    (tmp_path / "reranker" / "reranker.json").write_text("{}")
    for text in ("eval", "heldout"):
        (tmp_path / "ppl" / text / "predictive").mkdir(parents=True)
        (tmp_path / "ppl" / text / "predictive" / "results.json").write_text(json.dumps({"ppl_word": 4.7}))
    names = seed_names([0, 1], 0)
    reuse_config_seed(tmp_path, ["eval", "heldout"], names, 0)
    assert (tmp_path / "reranker-seed0" / "reranker.json").exists()
    assert json.loads((tmp_path / "ppl" / "eval" / "predictive-seed0" / "results.json").read_text())["ppl_word"] == 4.7
    assert not (tmp_path / "reranker-seed1").exists()  # the other seeds are fitted, never borrowed


def test_nothing_is_reused_without_a_finished_plain_run(tmp_path):
    (tmp_path / "reranker").mkdir()  # a fit that never exported
    reuse_config_seed(tmp_path, ["eval"], seed_names([0, 1], 0), 0)
    assert not (tmp_path / "reranker-seed0").exists()
