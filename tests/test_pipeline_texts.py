"""The pipeline's split stage (pipeline/texts.py): article halves, training articles held out by title, slices,
corpus exclusions and texts of any format; on WikiText-2 it writes the committed data's texts byte for byte."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from ralm.articles import article_halves, hashed_below, split_articles
from ralm.settings import InputError, Text


def _recipe(tmp_path, texts: dict, corpus: dict | None = None, split: dict | None = None, **more):
    """A Recipe of these texts (the data, fit and eval settings are the demo's: only their files are checked)."""
    from pipeline.plan import Recipe
    from pipeline.recipe import Corpus, Data, Evaluation, Fit, Report, Source, Split, Texts

    cfg = "configs/demo/"
    return Recipe(out=str(tmp_path / "out"), lm=None, encoder=None,
                  texts=Texts(train=Source(**texts["train"]), report={k: Source(**v) for k, v in texts["report"].items()},
                              dev=Source(**texts["dev"]) if "dev" in texts else None),
                  corpus=Corpus(**(corpus or {})), split=Split(**(split or {})),
                  data=Data(config=cfg + "build.yaml", **more.get("data", {})),
                  fits=[Fit(name="f", configs=[cfg + "fit.yaml"])], eval=Evaluation(config=cfg + "ppl.yaml"),
                  report=Report())


def _wikitext(n: int, seed: int) -> str:
    """``n`` titled articles of six paragraphs each, in raw WikiText layout (halves need four or more)."""
    return " \n" + "".join(f" = Article {seed}-{i} = \n \n" + "".join(f" words of paragraph {j} in {seed} {i} . \n \n"
                                                                      for j in range(6)) for i in range(n))


def _articles(text):
    return [(p, t) for p, t in zip(*split_articles(text)) if t]


def test_halves_make_the_corpus_and_the_read_texts_and_held_out_articles_leave_the_training_text(tmp_path):
    from pipeline.texts import write_texts

    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_text(_wikitext(30, 0))
    test.write_text(_wikitext(12, 1))
    r = _recipe(tmp_path, {"train": {"file": str(train)},
                           "report": {"a": {"file": str(test), "articles": [0, 5]}, "b": {"file": str(test), "articles": [5, 9]}}},
                split={"halves": True, "heldout_fraction": 0.5, "seed": 3})
    write_texts(r)
    texts = tmp_path / "out" / "texts"
    halves = {f: article_halves(f.read_text()) for f in (train, test)}
    assert (texts / "corpus.txt").read_text() == "".join(h[1] for f in (train, test) for h in halves[f])
    assert (texts / "a.txt").read_text() == "".join(h[2] for h in halves[test][:5])
    assert (texts / "b.txt").read_text() == "".join(h[2] for h in halves[test][5:9])
    second = _articles("".join(h[2] for h in halves[train]))
    held = hashed_below([t for _, t in second], 0.5, 3)
    assert (texts / "train.txt").read_text() == "".join(p for (p, _), h in zip(second, held) if not h)
    assert (texts / "train-heldout.txt").read_text() == "".join(p for (p, _), h in zip(second, held) if h)
    assert 0 < held.sum() < len(held)
    write_texts(r)  # the same settings again: every file unchanged
    r2 = _recipe(tmp_path, {"train": {"file": str(train)}, "report": {"a": {"file": str(test), "articles": [0, 5]}}},
                 split={"halves": True, "heldout_fraction": 0.5, "seed": 4})
    before = {f.name: f.read_text() for f in texts.iterdir()}
    with pytest.raises(ValueError, match="train-heldout.txt, train.txt exist.s. with other contents"):
        write_texts(r2)
    assert {f.name: f.read_text() for f in texts.iterdir()} == before  # nothing written


def test_a_plain_text_is_read_where_it_is_and_a_slice_or_records_are_written(tmp_path):
    from pipeline.texts import write_texts
    from ralm.tiny import wikitext_articles

    text = tmp_path / "t.txt"
    text.write_text(wikitext_articles(n_articles=6, seed=2))
    beir = tmp_path / "docs.jsonl"
    beir.write_text("".join(json.dumps({"_id": f"d{i}", "title": f"Doc {i}", "text": f"line one {i}\nline two"}) + "\n"
                            for i in range(3)))
    r = _recipe(tmp_path, {"train": {"file": str(text)},
                           "report": {"slice": {"file": str(text), "articles": [2, 4]}, "recs": {"file": str(beir)}}},
                corpus={"file": str(text)})
    # a whole file of any format is read where it is (--text.file reads records as titled articles)
    assert r.text_file("train") == text and r.text_file("recs") == beir and r.corpus_file() == text
    write_texts(r)
    out = tmp_path / "out" / "texts"
    assert sorted(p.name for p in out.iterdir()) == ["slice.txt"]
    assert (out / "slice.txt").read_text() == "".join(p for p, _ in _articles(text.read_text())[2:4])
    recs = Text(file=str(beir)).load()
    assert [t for _, t in _articles(recs)] == ["Doc 0", "Doc 1", "Doc 2"] and " line two \n" in recs


def test_excluded_documents_leave_the_corpus(tmp_path):
    from pipeline.texts import write_texts
    from ralm.tiny import wikitext_articles

    text = tmp_path / "t.txt"
    text.write_text(wikitext_articles(n_articles=6, seed=2))
    titles = [t for _, t in _articles(text.read_text())]
    recs = tmp_path / "passages.jsonl"
    recs.write_text("".join(json.dumps({"id": f"p{i}", "contents": f"T{i}\nsome text {i}"}) + "\n" for i in range(4)))
    (tmp_path / "drop.txt").write_text("p1\n\n")
    (tmp_path / "drop-text.txt").write_text(titles[0] + "\n")
    for corpus, name, exclude, drop in ((text, "corpus.txt", [titles[0]], "drop-text.txt"),
                                        (recs, "corpus.jsonl", ["T3"], "drop.txt")):
        out = tmp_path / name
        r = _recipe(out, {"train": {"file": str(text)}, "report": {"x": {"file": str(text)}}},
                    corpus={"file": str(corpus), "exclude": exclude, "exclude_file": str(tmp_path / drop)})
        assert r.corpus_file() == out / "out" / "texts" / name
        write_texts(r)
        got = r.corpus_file().read_text()
        if name == "corpus.txt":
            assert [t for _, t in _articles(got)] == titles[1:]
        else:
            assert [json.loads(line)["id"] for line in got.splitlines()] == ["p0", "p2"]


def test_an_exclusion_that_matches_nothing_is_refused_with_near_matches(tmp_path):
    """A name that is no document's title or id (a file stem misremembered: `tempest` for `tempest_gut`) would
    leave the document in the corpus, a leak: it is one error naming it, the near titles and what a title is."""
    from pipeline.texts import write_texts

    folder = tmp_path / "plays"
    folder.mkdir()
    for stem in ("tempest_gut", "hamlet_gut", "macbeth"):
        (folder / f"{stem}.txt").write_text(f"The text of {stem}.\n\nA second paragraph.\n")
    text = tmp_path / "t.txt"
    text.write_text(" = A = \n \n a b c . \n")
    r = _recipe(tmp_path / "x", {"train": {"file": str(text)}, "report": {"x": {"file": str(text)}}},
                corpus={"file": str(folder), "exclude": ["tempest", "macbeth"]})
    with pytest.raises(InputError, match=r"1 name\(s\) match no document .*'tempest' \(near: 'tempest_gut'\).*"
                                         r"file's name without .txt"):
        write_texts(r)
    assert not (tmp_path / "x" / "out" / "texts" / "corpus.txt").exists()


def test_the_wikitext2_recipes_split_writes_the_committed_datas_texts(tmp_path, shared_dir):
    """configs/recipes/wikitext2-smollm2.yaml's split stage on ../shared's WikiText-2: the corpus, the fit-side
    training text and the evaluated texts the committed scores (data/real/smollm2-wt2-artfit-25k.scores.npz) were
    made from, byte for byte (sha256 of the files the earlier script wrote)."""
    from pipeline.__main__ import main

    recipe = yaml.safe_load(open("configs/recipes/wikitext2-smollm2.yaml"))
    for name, src in [("train", recipe["texts"]["train"]), ("dev", recipe["texts"]["dev"]),
                      *recipe["texts"]["report"].items()]:
        src["file"] = str(shared_dir / src["file"].split("shared/", 1)[1])
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["--config", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "wt2"), "--stage", "split"]) == 0
    want = {"corpus": "8955d8a5839961ec1d27d5e2528bb3579b2aafe5d87e837f6980763aefaf7732",
            "train": "939223605ab083ee78585d6dd9b2e30eff8c3884b34fdc400a94708bc8b21d7a",
            "train-heldout": "caaf40b6ea35a9c22d81dbf6e9d32863c0d56b5850feb9bed7458d8e4f3a791a",
            "dev": "123142df21c77d740dea6aa28e3ef22bf1d61e06f2452728c3bb491d1d663971",
            "report": "f08643203adc51dee7155330562f999d19b78e40931d3bb38a729eb01e6ad982",
            "recheck": "0d15c577d65a28a4165f7635e54bdd74dd25046603eac8ec0fcee6187eb7d119"}
    got = {n: hashlib.sha256((tmp_path / "wt2" / "texts" / f"{n}.txt").read_bytes()).hexdigest() for n in want}
    assert got == want
