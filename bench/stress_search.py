"""Stress the BM25 search process next to torch work: many retrieval-heavy jobs in one Python process.

    python bench/stress_search.py               # 100 jobs (a few minutes on 2 cores)
    python bench/stress_search.py --jobs 20 --kill-every 5

Each job starts a ``SearchProcess`` over a real Lucene index made here, submits batches of queries
(pipelined) while the parent runs a tiny GPT-2's forward passes on 2 threads with ``faulthandler``
enabled (as pytest does: the setting under which an in-process JVM once died of SIGSEGV), checks
every result against the first job's, and closes it. ``--kill-every N`` also SIGKILLs the search child
in every N-th job mid-batch, which must be restarted with the batch retried. Prints jobs, queries,
restarts and mismatches; exit 1 on any mismatch or crash.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--batches", type=int, default=8, help="query batches per job")
    ap.add_argument("--kill-every", type=int, default=10, help="SIGKILL the search child in every N-th job (0: never)")
    a = ap.parse_args(argv)
    faulthandler.enable()
    import torch

    from ralm.search_process import SearchProcess
    from ralm.tiny import make_gpt2, train_tokenizer, wikitext_articles

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="stress_search_"))
    text = wikitext_articles(n_articles=300, seed=1)
    (work / "corpus.txt").write_text(text)
    subprocess.run([sys.executable, "-m", "ralm.corpus", "--text.file", str(work / "corpus.txt"), "--out",
                    str(work / "corpus")], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    tok = train_tokenizer([text[:50000]], work / "lm", vocab_size=512)
    lm = make_gpt2(work / "lm", tok, n_layer=2, n_embd=64, n_head=2, seed=0).eval()
    words = text.split()
    queries = [" ".join(words[i:i + 25]) for i in range(0, 25 * 64, 25)]
    x = torch.randint(0, 500, (8, 256))
    expected, mismatches, n_queries, kills = None, 0, 0, 0
    t0 = time.time()
    for job in range(a.jobs):
        with SearchProcess(str(work / "corpus" / "index")) as sp:
            futures = [sp.submit(queries, 16, forbidden={"Article 7"}) for _ in range(a.batches)]
            if a.kill_every and job % a.kill_every == a.kill_every - 1:
                os.kill(sp._proc.pid, signal.SIGKILL)
                kills += 1
            with torch.no_grad():
                for _ in range(3):
                    lm(x)  # torch work in this process while the child searches
            for f in futures:
                got = [[p.docid for p in r] for r in f.result(timeout=300)]
                expected = expected or got
                mismatches += got != expected
                n_queries += len(queries)
        if job % 10 == 9:
            print(f"{job + 1} jobs, {n_queries:,} queries, {kills} kills, {mismatches} mismatches, "
                  f"{time.time() - t0:.0f} s", flush=True)
    print(f"done: {a.jobs} jobs, {n_queries:,} queries, {kills} search children SIGKILLed and restarted, "
          f"{mismatches} mismatching results, no crash ({time.time() - t0:.0f} s)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
