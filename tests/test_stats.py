"""eval.stats against plain transcriptions, and eval.compare printing them for any set of runs."""

import math
import random

import numpy as np
import pytest

from eval.stats import paired_bootstrap, sign_test, units_of


def _plain_bootstrap(nll, base, toks, words, unit, samples, seed):
    """One resample at a time, unit by unit, as the method is written down."""
    n_units = int(unit.max()) + 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_units, size=(samples, n_units))
    w_per_tok = words / toks.sum()
    changes = []
    for row in draws:
        d = t = 0.0
        for u in row:
            sel = unit == u
            d += float((nll[sel] - base[sel]).sum())
            t += float(toks[sel].sum())
        changes.append(math.exp(d / (w_per_tok * t)) - 1)
    return np.percentile(changes, [2.5, 97.5]), np.mean(np.array(changes) >= 0)


def test_paired_bootstrap_matches_a_plain_transcription():
    rng = np.random.default_rng(0)
    n = 57  # strides; 5 articles of uneven length
    article = np.sort(rng.integers(0, 5, size=n))
    toks = rng.integers(3, 33, size=n).astype(float)
    base = rng.gamma(2.0, 20.0, size=n)
    nll = base + rng.normal(-1.0, 3.0, size=n)
    unit, name = units_of(n, article)
    assert name == "article" and unit.max() == len(np.unique(article)) - 1
    bs = paired_bootstrap(nll, base, toks, 400, unit, name, samples=200, seed=3)
    (lo, hi), p = _plain_bootstrap(nll, base, toks, 400, unit, 200, 3)
    assert bs.change == pytest.approx(math.exp((nll - base).sum() / 400) - 1, rel=1e-12)
    assert (bs.low, bs.high, bs.p_not_better) == pytest.approx((lo, hi, p), rel=1e-9)
    assert bs.low <= bs.change <= bs.high


def test_identical_runs_have_a_zero_width_interval_and_blocks_cover_every_stride():
    x = np.arange(30, dtype=float)
    unit, name = units_of(30, None, blocks=7)
    assert name == "block" and sorted(set(unit.tolist())) == list(range(7)) and (np.diff(unit) >= 0).all()
    bs = paired_bootstrap(x, x, np.ones(30), 50, unit, name)
    assert (bs.change, bs.low, bs.high) == (0.0, 0.0, 0.0)


def test_sign_test_is_the_exact_two_sided_binomial():
    rng = random.Random(1)
    d = [rng.choice([-1.0, 1.0, 0.0]) for _ in range(41)]
    better, worse, p = sign_test(np.array(d), np.zeros(41))
    n = better + worse
    k = min(better, worse)
    plain = min(1.0, 2 * sum(math.comb(n, i) * 0.5 ** n for i in range(k + 1)))
    assert (better, worse) == (d.count(-1.0), d.count(1.0)) and p == pytest.approx(plain, rel=1e-12)
    assert sign_test(np.zeros(3), np.zeros(3)) == (0, 0, 1.0)
    assert sign_test(-np.ones(20), np.zeros(20))[2] == pytest.approx(2 * 0.5 ** 20)


def test_seeds_are_resampled_with_the_units():
    """Several seeds' runs: the change of their mean NLL, each resample drawing seeds with replacement too."""
    rng = np.random.default_rng(1)
    n, seeds = 40, 3
    article = np.sort(rng.integers(0, 6, size=n))
    toks = rng.integers(3, 33, size=n).astype(float)
    base = rng.gamma(2.0, 20.0, size=n)
    nll = base + rng.normal(-0.5, 3.0, size=(seeds, n))
    unit, name = units_of(n, article)
    bs = paired_bootstrap(nll, base, toks, 300, unit, name, samples=150, seed=4)
    # plain: one resample at a time, seed by seed, unit by unit
    r = np.random.default_rng(4)
    n_units = int(unit.max()) + 1
    draws = r.integers(0, n_units, size=(150, n_units))
    picks = r.integers(0, seeds, size=(150, seeds))
    changes = []
    for row, pick in zip(draws, picks):
        d = t = 0.0
        for u in row:
            sel = unit == u
            d += sum(float((nll[s][sel] - base[sel]).sum()) for s in pick) / seeds
            t += float(toks[sel].sum())
        changes.append(math.exp(d / (300 / toks.sum() * t)) - 1)
    assert bs.change == pytest.approx(math.exp((nll.mean(0) - base).sum() / 300) - 1, rel=1e-12)
    assert (bs.low, bs.high, bs.p_not_better) == pytest.approx(
        (*np.percentile(changes, [2.5, 97.5]), np.mean(np.array(changes) >= 0)), rel=1e-9)
    # identical seeds are one run
    one = paired_bootstrap(nll[0], base, toks, 300, unit, name, samples=150, seed=4)
    same = paired_bootstrap(np.stack([nll[0]] * 3), base, toks, 300, unit, name, samples=150, seed=4)
    assert (same.change, same.low, same.high) == pytest.approx((one.change, one.low, one.high), rel=1e-12)


def test_compare_adds_the_mean_of_a_rerankers_seeds():
    from pathlib import Path

    from eval.compare import table

    rng = np.random.default_rng(2)
    n, words = 30, 500
    toks = np.full(n, 10.0)
    article = np.repeat(np.arange(5), 6)

    def fake(name, nll):
        ppl = math.exp(nll.sum() / words)
        return {"dir": Path("/runs") / name, "nll": nll, "n_tokens": toks, "article": article,
                "rank": np.zeros(n, dtype=int), "results": {"reranker": f"/runs/{name}" if "seed" in name else name,
                "ppl_word": ppl, "ppl_token": math.exp(nll.sum() / toks.sum()), "n_words": words,
                "n_strides": n, "n_scored_tokens": int(toks.sum()), "seconds_per_1000_strides": 100.0}}

    base = rng.gamma(2.0, 20.0, size=n)
    seeds = [base + rng.normal(-1.0, 2.0, size=n) for _ in range(2)]
    runs = [fake("bm25", base), fake("pred-seed0", seeds[0]), fake("pred-seed1", seeds[1])]
    md = table(runs, "bm25")
    row = next(line for line in md.splitlines() if "pred, mean of 2 seeds" in line)
    geo = math.exp(np.mean([math.log(r["results"]["ppl_word"]) for r in runs[1:]]))
    bs = paired_bootstrap(np.stack(seeds), base, toks, words, *units_of(n, article))
    assert f"| {geo:.3f} |" in row and bs.cell() in row
    assert md.index("pred-seed1") < md.index("pred, mean of 2 seeds")
    assert "mean of" not in table(runs[:2], "bm25")  # one seed: no mean row


def test_compare_says_when_retrieval_hurts_and_when_articles_are_few():
    """eval.compare's notes above its table: none beating bm25 and the oracle (each row's change against none,
    and the levers), and intervals resting on fewer than FEW_UNITS articles; nothing when neither holds."""
    from pathlib import Path

    from eval.compare import FEW_UNITS, notes

    def fake(name, ppl, articles):
        return {"dir": Path("/runs") / name, "nll": np.zeros(12), "article": np.arange(12) % articles,
                "results": {"reranker": name, "ppl_word": ppl}}

    hurt = notes([fake("none", 300.0, 4), fake("bm25", 360.0, 4), fake("oracle", 330.0, 4)])
    assert "**Retrieval hurts this text**: no passage (none, word ppl 300.000) beats every retrieval row: " \
           "bm25 360.000 (+20.0%), oracle 330.000 (+10.0%) — the oracle too" in hurt
    assert "windows.doc_max_tokens" in hurt and "model.abstain: true" in hurt and "**Only 4 articles**" in hurt
    assert all(line.startswith(">") for line in hurt.strip().splitlines())
    helps = [fake("none", 300.0, FEW_UNITS), fake("bm25", 280.0, FEW_UNITS), fake("oracle", 250.0, FEW_UNITS)]
    assert notes(helps) == ""
    some = notes([*helps, fake("random", 310.0, FEW_UNITS)])  # one row worse than none, bm25 better: no note
    assert some == ""
    bm25_only = notes([fake("none", 300.0, 12), fake("bm25", 301.0, 12), fake("oracle", 250.0, 12)])
    assert "beats bm25 301.000 (+0.3%)." in bm25_only and "oracle too" not in bm25_only


def test_strides_given_the_same_passage_by_the_same_lm_are_ties():
    """Rounding of differently shaped batches (zero-shot's LM head also covers its s' ranking tokens) moves
    the NLL of an unchanged stride by ~1e-5 nats on AVX-512 float32: such strides are ties in the sign test,
    and only they are, while the runs' LM inputs differ in nothing but the passage."""
    from eval.compare import same_input

    def run(docids, nll, windows=None, precision="float32 (auto: ...)", zero_shot_tokens=16, index="dir:idx:1"):
        ident = {"model": {"spec": "lm"}, "windows": {"stride": 4, "max_length": 64, "doc_max_tokens": 16,
                                                      "zero_shot_tokens": zero_shot_tokens, **(windows or {})},
                 "retrieval": {"index": index, "k": 8}}
        return {"results": {"identity": ident, "precision": precision}, "docid": np.array(docids, dtype=object),
                "nll": np.array(nll)}

    base = run(["", "a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0, 5.0])
    zs = run(["", "a", "x", "c", "y"], [1 + 1e-5, 2 - 1e-5, 2.5, 4 + 1e-5, 5.5], zero_shot_tokens=64)
    assert sign_test(zs["nll"], base["nll"])[:2] == (2, 3)                          # rounding counted as change
    assert sign_test(zs["nll"], base["nll"], ties=same_input([zs], base))[:2] == (1, 1)
    seeds = [zs, run(["", "a", "b", "z", "y"], [1.0, 2.0, 3.0, 3.0, 5.5])]         # a tie only where all seeds are
    assert same_input(seeds, base).tolist() == [True, True, False, False, False]
    for other in (run(["", "a", "b", "c", "d"], zs["nll"], windows={"doc_max_tokens": 32}),
                  run(["", "a", "b", "c", "d"], zs["nll"], precision="bfloat16 (auto: ...)"),
                  run(["", "a", "b", "c", "d"], zs["nll"], index="dir:another:2")):
        assert same_input([other], base) is None                                   # another LM input: no ties


def test_the_mean_of_seeds_is_the_geometric_mean():
    """What a table's mean-of-seeds row shows: the geometric mean of the seeds' perplexities."""
    from eval.compare import mean_of_seeds

    assert mean_of_seeds([4.7, 4.9, 4.5]) == pytest.approx((4.7 * 4.9 * 4.5) ** (1 / 3), rel=1e-12)
    assert mean_of_seeds([5.0]) == pytest.approx(5.0, rel=1e-15)
