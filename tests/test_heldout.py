"""reranking.judging's table (python -m reranking.heldout): its paired bootstrap, per example and per article, against plain loops."""

import re

import numpy as np
import pytest

from reranking.judging import table


def _intervals(text):
    return [tuple(float(x) for x in m) for m in re.findall(r"([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\]", text)]


def _loop_interval(d, groups, draws):
    """The cluster bootstrap written out: each resample's mean over the examples of its drawn groups."""
    ids = sorted(set(groups))
    means = []
    for draw in draws:
        picked = [x for j in draw for x, gr in zip(d, groups) if gr == ids[j]]
        means.append(sum(picked) / len(picked))
    return np.percentile(means, [2.5, 97.5])


def _case(seed=0, n=60):
    rng = np.random.default_rng(seed)
    lm = -rng.gamma(5.0, 20.0, size=(n, 4))
    picks = {"a": rng.integers(4, size=n), "b": rng.integers(4, size=n)}
    return lm, picks


def test_per_example_intervals_are_the_plain_paired_bootstrap():
    lm, picks = _case()
    n = len(lm)
    got = _intervals(table(lm, picks, ["b"], resamples=200, seed=3))
    draws = np.random.default_rng(3).integers(n, size=(200, n))
    d = -lm[np.arange(n), picks["a"]] + lm[np.arange(n), picks["b"]]
    lo, hi = np.percentile(d[draws].mean(1), [2.5, 97.5])
    assert got[1][0] == round(d.mean(), 3) and got[1][1:] == (round(lo, 3), round(hi, 3))  # row a, vs b


def test_per_article_intervals_resample_whole_articles():
    lm, picks = _case(seed=1)
    n = len(lm)
    titles = np.array([f"T{i % 7}" for i in range(n)])  # 7 articles, their examples interleaved
    groups = np.unique(titles, return_inverse=True)[1]
    text = table(lm, picks, ["b"], resamples=100, seed=5, groups=groups)
    assert "intervals resample 7 articles" in text
    draws = np.random.default_rng(5).integers(7, size=(100, 7))
    d = (-lm[np.arange(n), picks["a"]] + lm[np.arange(n), picks["b"]]).tolist()
    lo, hi = _loop_interval(d, groups.tolist(), draws)
    assert _intervals(text)[1][1:] == (round(lo, 3), round(hi, 3))
    assert _intervals(text)[1][0] == round(float(np.mean(d)), 3)  # the point estimate stays the examples' mean


def test_a_choice_of_no_passage_counts_the_lms_log_probability_without_one():
    """A pick of -1 (a reranker that may abstain) is scored with the stored log p(y | x); the table says how
    often each row took no passage and gives no passage and the abstaining oracle in its header; the JSON
    numbers are the same means."""
    from reranking.judging import summary

    lm, picks = _case(seed=2)
    n = len(lm)
    nodoc = lm.max(1) + np.where(np.arange(n) % 3 == 0, 1.0, -1.0)  # better than every passage on a third
    abstaining = np.where(nodoc > lm.max(1), -1, lm.argmax(1))
    picks = {**picks, "c": abstaining}
    text = table(lm, picks, [], resamples=50, nodoc=nodoc)
    want = -np.mean([nodoc[i] if p < 0 else lm[i, p] for i, p in enumerate(abstaining)])
    row = next(line for line in text.splitlines() if line.startswith("| c |"))
    assert row.split(" | ")[1] == f"{want:.3f}" and f"| {np.mean(abstaining < 0):.1%} |" in row
    assert f"no passage {-nodoc.mean():.3f}, the oracle that may abstain {want:.3f}" in text
    numbers = summary(lm, picks, nodoc)
    assert numbers["rows"]["c"]["nll"] == pytest.approx(want) and numbers["oracle_abstain_nll"] == pytest.approx(want)
    assert numbers["rows"]["a"]["no_passage"] == 0.0
