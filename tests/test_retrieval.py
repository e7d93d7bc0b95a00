"""BM25 retrieval on a real Lucene index built during the session (see ``bm25_corpus`` in conftest)."""

from __future__ import annotations

import json

import pytest

from ralm.articles import forbidden_titles
from ralm.retrieval import (
    Passage,
    RetrievalCache,
    parse_contents,
    passage_from_reference_doc,
    passages_from_reference,
    query_text,
    read_reference_json,
    reference_entry,
    write_reference_json,
)
from ralm.search_process import SearchProcess


@pytest.fixture(scope="module")
def retriever(bm25_corpus):
    """The BM25 retriever as the project runs it: in a search process of its own (so this pytest
    process never hosts a JVM; ralm.search_process serves BM25Retriever's search over pipes)."""
    with SearchProcess(str(bm25_corpus["index"])) as sp:
        yield sp


@pytest.fixture(scope="module")
def queries(bm25_corpus) -> list[str]:
    """Queries cut from article bodies (each has a clear source article)."""
    from ralm.articles import iter_articles

    arts = list(iter_articles(bm25_corpus["text"]))
    return [" ".join(body.split()[40:65]) for _, body in arts[:12]]


def test_index_and_passages(retriever, bm25_corpus, queries):
    assert retriever.num_docs == bm25_corpus["n_passages"]
    assert (retriever.k1, retriever.b) == (0.9, 0.4)
    titles = forbidden_titles(bm25_corpus["text"])
    res = retriever.search(queries, k=16)
    assert len(res) == len(queries)
    for hits in res:
        assert len(hits) == 16
        scores = [p.score for p in hits]
        assert scores == sorted(scores, reverse=True)
        for p in hits:
            assert p.title in titles and 0 < len(p.text.split()) <= 100
            assert p.document() == f"{p.title}\n{p.text}"
    long = [p for hits in res for p in hits if len(p.text.split()) == 100]
    assert len(long) > len(queries)  # most passages are full 100-word chunks


def test_exclusions_and_overfetch(retriever, queries):
    k = 5
    full = retriever.search(queries[:4], k=retriever.num_docs)  # the whole ranking, unfiltered
    all_titles = sorted({p.title for hits in full for p in hits})
    allowed = set(all_titles[:6])  # few allowed titles: their passages sit deep in most rankings
    forbidden = set(all_titles) - allowed
    exclude = [full[0][0].title, None, full[2][0].title, None]
    got = retriever.search(queries[:4], k=k, exclude_titles=exclude, forbidden=forbidden)
    for i, hits in enumerate(got):
        expect = [p for p in full[i] if p.title not in forbidden and p.title != exclude[i]][:k]
        assert [p.docid for p in hits] == [p.docid for p in expect]
        assert len(hits) == k
    # the first depth (2k = 10) was not enough, not even after doubling twice: over-fetch happened
    deepest = max(next(j for j, p in enumerate(full[i]) if p.docid == got[i][-1].docid) for i in range(4))
    assert deepest >= 4 * 2 * k


def test_empty_query_and_exhausted_corpus(retriever, bm25_corpus):
    titles = forbidden_titles(bm25_corpus["text"])
    res = retriever.search(["", "   ", "river castle"], k=3, forbidden=titles)
    assert res == [[], [], []]  # everything forbidden: the corpus is exhausted, not an endless loop


def test_query_uses_only_the_past(tiny_gpt2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    ids = tok("the river was built in the first year of the war and the city called it new", add_special_tokens=False)["input_ids"]
    end = len(ids) - 3
    assert query_text(tok, ids, end, 5) == tok.decode(ids[end - 5 : end])
    changed_future = ids[:end] + [ids[0]] * 3
    assert query_text(tok, changed_future, end, 5) == query_text(tok, ids, end, 5)
    assert query_text(tok, ids, 2, 32) == tok.decode(ids[:2])
    assert query_text(tok, ids, 0, 32) == ""


def test_bad_index_raises(tmp_path):
    with pytest.raises(ValueError, match=r"'no-such-index'.*ralm\.corpus"):
        SearchProcess("no-such-index")
    with pytest.raises(ValueError, match="not a Lucene index"):
        SearchProcess(str(tmp_path))


def test_parse_contents():
    assert parse_contents('"Aaron"\nAaron is a prophet') == ("Aaron", "Aaron is a prophet")
    assert parse_contents("Title\ntext\nmore") == ("Title", "text\nmore")
    assert parse_contents("no title") == ("", "no title")


def test_reference_json_round_trip(tmp_path, retriever, queries):
    res = retriever.search(queries[:3], k=4)
    entries = [reference_entry(32 * i, 32 * i + 32, "future text", q, hits) for i, (q, hits) in enumerate(zip(queries, res))]
    # reference-made docs: DPR-style quoted title without a title key, and docs with a title key
    entries.append({"begin_location": 96, "end_location": 128, "future": "x", "query": "q", "retrieved_docs": [
        {"text": '"Aaron"\nAaron is a prophet', "score": 12.5},
        {"title": "Beta", "text": "beta text", "score": 3.25},
        {"title": "", "text": "untitled", "score": 1.0},
    ]})
    path = tmp_path / "ret.json"
    write_reference_json(path, entries)
    back = read_reference_json(path)
    assert back == entries
    passages = passages_from_reference(back)
    assert passages[:3] == res
    docs = [p.document() for p in passages[3]]
    assert docs == ['"Aaron"\nAaron is a prophet', "Beta\nbeta text", "untitled"]
    assert passages[3][0].title == "Aaron"
    # passages → entries → file is byte-identical
    again = [dict(e, retrieved_docs=[]) for e in back]
    for e, ps in zip(again, passages):
        e["retrieved_docs"] = [json.loads(json.dumps(d)) for d in reference_entry(0, 0, "", "", ps)["retrieved_docs"]]
    write_reference_json(tmp_path / "again.json", again)
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    assert passage_from_reference_doc({"text": "A\nb", "score": 1.0}) == Passage("", "A", "b", 1.0, contents="A\nb")


def test_cache(tmp_path, retriever, bm25_corpus, queries):
    cache = RetrievalCache(tmp_path / "cache")
    forbidden = {sorted(forbidden_titles(bm25_corpus["text"]))[0]}
    first = cache.search(retriever, queries[:5], k=4, forbidden=forbidden)
    key = RetrievalCache.key(retriever.fingerprint(), retriever.k1, retriever.b, 4, queries[:5], None, forbidden)
    assert cache.get(key) == first
    assert cache.search(retriever, queries[:5], k=4, forbidden=forbidden) == first
    with SearchProcess(str(bm25_corpus["index"]), k1=1.2) as other:
        assert other.fingerprint() != retriever.fingerprint()
    key2 = RetrievalCache.key(other.fingerprint(), other.k1, other.b, 4, queries[:5], None, forbidden)
    assert cache.get(key2) is None
    assert cache.get(RetrievalCache.key(retriever.fingerprint(), 0.9, 0.4, 5, queries[:5], None, forbidden)) is None


def test_index_without_raw_raises(tmp_path):
    import subprocess

    from ralm.java import anserini_jar, java_binary
    from ralm.passages import write_passages

    write_passages([("T", "alpha beta gamma")], tmp_path / "jsonl")
    subprocess.run([str(java_binary()), "-cp", str(anserini_jar()), "io.anserini.index.IndexCollection",
                    "-collection", "JsonCollection", "-input", str(tmp_path / "jsonl"), "-index", str(tmp_path / "idx"),
                    "-threads", "1", "-quiet"], check=True, capture_output=True)
    with pytest.raises(ValueError, match="-storeRaw"):
        SearchProcess(str(tmp_path / "idx"))


def test_search_process_pipelines_and_survives_a_kill(retriever, bm25_corpus, queries):
    """A second search process returns what the first does, pipelines submitted batches, and a
    SIGKILLed child is restarted with the pending batch retried."""
    import os
    import signal

    excl = [None, "Article 3"] * (len(queries) // 2) + [None] * (len(queries) % 2)
    expected = retriever.search(queries, 5, exclude_titles=excl)

    def same(got):
        assert [[(p.docid, p.title, p.text) for p in r] for r in got] == \
            [[(p.docid, p.title, p.text) for p in r] for r in expected]
        for g, e in zip(got, expected):
            assert [p.score for p in g] == pytest.approx([p.score for p in e], rel=1e-6)

    with SearchProcess(str(bm25_corpus["index"])) as sp:
        assert sp.num_docs == bm25_corpus["n_passages"]
        futures = [sp.submit(queries, 5, exclude_titles=excl) for _ in range(3)]
        for f in futures:
            same(f.result(timeout=60))
        os.kill(sp._proc.pid, signal.SIGKILL)
        same(sp.submit(queries, 5, exclude_titles=excl).result(timeout=120))


def test_the_search_process_ends_with_its_parent(retriever, tmp_path):
    """A parent SIGKILLed while its search process is busy (a long search, a JVM starting): the search process is
    gone within about a second (it watches for being orphaned), not left running until its pipe is read again.
    The busy child is a process that calls the search process's watch and then sleeps for minutes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.test_data_gen import ROOT

    assert retriever._proc.args[-1] == str(os.getpid())  # the search process is told its parent
    busy = ("import os, time\nfrom ralm.search_process import exit_when_orphaned\n"
            "exit_when_orphaned(os.getppid())\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    script = (f"import subprocess, sys, time\nc = subprocess.Popen([sys.executable, '-c', {busy!r}])\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    t0 = time.time()
    while time.time() - t0 < 10:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the child {child} outlived its SIGKILLed parent by 10 s")
    assert time.time() - t0 < 3


def test_many_large_requests_submitted_at_once_do_not_deadlock(retriever, queries):
    """Requests and answers each larger than a pipe's buffer, all submitted before any is read (as
    ``data_gen.retrieve`` submits a whole shard's batches): the submitter blocks on the child's full
    request pipe while the child blocks on its full answer pipe, so the reader must be able to take
    answers while a submission is under way (a 2,500-example shard hung here with one lock for both)."""
    import threading

    batch = queries * 40  # 480 queries: ~70 kB a request (over a pipe's 64 kB), ~1 MB an answer
    expected = retriever.search(queries, 5)
    results = []

    def submit_all():
        futures = [retriever.submit(batch, 5) for _ in range(40)]
        results.extend(f.result() for f in futures)

    t = threading.Thread(target=submit_all, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "submitting 40 large requests at once hung (request and answer pipes both full)"
    assert len(results) == 40
    for r in results:
        assert [[p.docid for p in x] for x in r] == [[p.docid for p in x] for x in expected] * 40


def test_a_jsonl_corpus_is_indexed_as_it_is_and_searched(tmp_path):
    """Passages a user already has (Pyserini JsonCollection and BEIR/DPR layouts, in one folder) are indexed
    with their own ids, no re-chunking, and come back with their titles and texts; a bad line is named."""
    from ralm.corpus import main

    src = tmp_path / "mine"
    src.mkdir()
    (src / "a.jsonl").write_text(
        json.dumps({"id": "doc-A", "contents": "Zanzibar Spices\nCloves and nutmeg grow on the island of Zanzibar."})
        + "\n\n" + json.dumps({"id": 7, "contents": "A note without a title about glaciers and moraines."}) + "\n")
    (src / "b.jsonl").write_text(
        json.dumps({"id": "doc-B", "title": "Basalt", "text": "Basalt columns form when lava cools slowly. " * 30})
        + "\n" + json.dumps({"id": "doc-C", "title": "", "text": "Herons wade in shallow estuaries."}) + "\n")
    assert main(["--text.file", str(src), "--out", str(tmp_path / "c"), "--threads", "1"]) == 0
    with SearchProcess(str(tmp_path / "c" / "index")) as sp:
        assert sp.num_docs == 4  # the 30-sentence passage was not cut into 100-word pieces
        got = {q: sp.search([q], k=1)[0][0] for q in ("cloves nutmeg", "glaciers moraines", "lava columns", "herons")}
    assert (got["cloves nutmeg"].docid, got["cloves nutmeg"].title) == ("doc-A", "Zanzibar Spices")
    assert got["cloves nutmeg"].text == "Cloves and nutmeg grow on the island of Zanzibar."
    assert (got["glaciers moraines"].docid, got["glaciers moraines"].title) == ("7", "")
    assert (got["lava columns"].docid, got["lava columns"].title) == ("doc-B", "Basalt")
    assert got["lava columns"].text == "Basalt columns form when lava cools slowly. " * 30
    assert (got["herons"].docid, got["herons"].title, got["herons"].text) == ("doc-C", "", "Herons wade in shallow estuaries.")

    (src / "c.jsonl").write_text('{"id": "x", "summary": "no text field"}\n')  # body, passage: texts too
    assert main(["--text.file", str(src), "--out", str(tmp_path / "d")]) == 2


def test_a_retrieval_file_output_that_is_a_folder_is_one_line(tmp_path, capsys):
    from eval.retrieval_file import main

    assert main(["--output", str(tmp_path), "--retrieval.index", str(tmp_path / "index")]) == 2
    err = capsys.readouterr().err
    assert "is a directory; give the JSON file to write" in err and len(err.strip().splitlines()) == 1
