"""BM25 in a process of its own: the JVM never shares a process with torch, Lightning or pytest.

HotSpot relies on its own SIGSEGV handler; anything else in the process that installs one (Python's
``faulthandler``, which pytest enables, native libraries) can turn the JVM's routine signals into a
crash, and a JVM inside a process makes ``fork`` unsafe. :class:`SearchProcess` starts
``python -m ralm.search_process`` (which starts the JVM and a :class:`~ralm.retrieval.BM25Retriever`)
and talks to it over a pipe. The main process stays JVM-free, so it may fork (DataLoader workers) and
use faulthandler freely.

Requests are pipelined: :meth:`SearchProcess.submit` returns at once with a
:class:`concurrent.futures.Future`, the search process works through requests in order while the
caller does other work (the LM scoring the previous chunk), and a reader thread collects the
answers. If the search process dies (a JVM crash, the OOM killer), it is restarted and the requests
still pending are sent again: a search is a pure function of its inputs, so nothing is lost. Its
Java logging goes to a log file whose tail is quoted in any error (``verbose=True`` shows it live).
The search process ends with its parent, however the parent ends (SIGKILL included): it watches for being
orphaned rather than waiting for its pipe to close after the search under way; a Ctrl-C or SIGTERM to the whole
process group is its parent's to handle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Collection, Sequence

from ralm.java import start_jvm
from ralm.retrieval import BM25Retriever, Passage
from ralm.settings import InputError

__all__ = ["SearchProcess", "SearchProcessError"]


class SearchProcessError(RuntimeError):
    """The search process failed in a way a restart did not fix."""


@dataclass
class _Request:
    id: int
    message: tuple
    future: Future


class SearchProcess:
    """A :class:`~ralm.retrieval.BM25Retriever` living in a child process (same ``search`` API).

    Args:
        index: a local Lucene index directory or a Pyserini prebuilt index name.
        k1, b: BM25 parameters.
        threads: Lucene search threads in the child (default: all cores).
        max_heap: JVM heap (``-Xmx``).
        verbose: let the child's Java/Pyserini logging through to stderr (default: to a log file).
        restarts: how many times a dead child is restarted before giving up.
    """
    def __init__(self, index: str, k1: float = 0.9, b: float = 0.4, threads: int | None = None,
                 max_heap: str = "2g", verbose: bool = False, restarts: int = 3) -> None:
        self.index, self.k1, self.b = str(index), float(k1), float(b)
        self.threads, self.max_heap, self.verbose = threads, max_heap, verbose
        self.restarts_left = restarts
        self._lock = threading.Lock()  # the pending requests; the reader takes it to deliver each answer
        # Writes to the child, a lock of their own: a write blocks while the child's request pipe is full,
        # and the child empties it only after the reader has taken its answers (which needs ``_lock``).
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Request] = {}
        self._next_id = 0
        self._forbidden_sent: set[int] = set()
        self._log_dir = tempfile.TemporaryDirectory(prefix="ralm-search-")
        self._closed = False
        info = self._start()
        self.num_docs: int = info["num_docs"]
        self._fingerprint: str = info["fingerprint"]

    # ---------------------------------------------------------------- process management
    def _start(self) -> dict:
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        self._log_path = Path(self._log_dir.name) / f"search-{self.restarts_left}.log"
        log = None if self.verbose else open(self._log_path, "w")
        cmd = [sys.executable, "-m", "ralm.search_process", str(child_r), str(child_w), str(os.getpid())]
        env = {**os.environ, "PYTHONFAULTHANDLER": "", "OMP_NUM_THREADS": "1"}
        env.pop("PYTHONFAULTHANDLER")
        self._proc = subprocess.Popen(cmd, pass_fds=(child_r, child_w), stdin=subprocess.DEVNULL,
                                      stdout=log or sys.stderr, stderr=log or sys.stderr, env=env)
        os.close(child_r)
        os.close(child_w)
        if log is not None:
            log.close()
        # Under the send lock: a request submitted meanwhile reaches the new child after "open", and is not
        # sent assuming a forbidden set that only the old child held.
        with self._send_lock:
            self._recv_conn = Connection(parent_r, writable=False)
            self._send_conn = Connection(parent_w, readable=False)
            self._forbidden_sent.clear()
            self._send_conn.send(("open", self.index, self.k1, self.b, self.threads, self.max_heap))
        try:
            kind, payload = self._recv_conn.recv()
        except (EOFError, OSError):
            raise SearchProcessError(f"the search process died while opening index {self.index!r}. "
                                     f"{self._log_tail()}") from None
        if kind == "error":
            self._proc.wait()
            raise InputError(payload)
        self._reader = threading.Thread(target=self._read_loop, args=(self._recv_conn,), daemon=True)
        self._reader.start()
        return payload

    def _log_tail(self, n: int = 15) -> str:
        if self.verbose or not self._log_path.exists():
            return ""
        lines = self._log_path.read_text(errors="replace").splitlines()[-n:]
        return "Its last log lines: " + " | ".join(lines) if lines else ""

    def _read_loop(self, conn: Connection) -> None:
        while True:
            try:
                kind, rid, payload = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                req = self._pending.pop(rid, None)
            if req is None:
                continue
            if kind == "ok":
                req.future.set_result(payload)
            else:
                req.future.set_exception(InputError(payload) if kind == "input_error" else SearchProcessError(payload))
        if not self._closed:
            self._restart()

    def _restart(self) -> None:
        code = self._proc.wait()
        with self._lock:
            pending = sorted(self._pending.values(), key=lambda r: r.id)
            if self.restarts_left <= 0:
                err = SearchProcessError(f"the search process died (exit {code}) and was restarted too often; "
                                         f"rerun the same command to continue. {self._log_tail()}")
                for r in pending:
                    r.future.set_exception(err)
                self._pending.clear()
                return
            self.restarts_left -= 1
        print(f"[search] the search process died (exit {code}); restarting it and repeating "
              f"{len(pending)} pending request(s)", file=sys.stderr, flush=True)
        try:
            self._start()
        except Exception as e:  # noqa: BLE001 - every waiter must hear about it
            with self._lock:
                for r in pending:
                    r.future.set_exception(e)
                self._pending.clear()
            return
        with self._lock, self._send_lock:
            for r in pending:
                self._send(r)

    def _send(self, req: _Request) -> None:
        kind, queries, k, exclude, forbidden = req.message
        key = hash(forbidden)
        if forbidden and key not in self._forbidden_sent:
            self._send_conn.send(("forbid", key, sorted(forbidden)))
            self._forbidden_sent.add(key)
        self._send_conn.send(("search", req.id, queries, k, exclude, key if forbidden else None))

    # ---------------------------------------------------------------- the retriever API
    def fingerprint(self) -> str:
        return self._fingerprint

    def submit(self, queries: Sequence[str], k: int, exclude_titles: Sequence[str | None] | None = None,
               forbidden: Collection[str] = ()) -> Future:
        """Start a search; returns at once. Same arguments as :meth:`BM25Retriever.search`."""
        if self._closed:
            raise SearchProcessError("this SearchProcess is closed")
        fut = Future()
        msg = ("search", list(queries), int(k), None if exclude_titles is None else list(exclude_titles),
               frozenset(forbidden))
        with self._lock:
            req = _Request(self._next_id, msg, fut)
            self._next_id += 1
            self._pending[req.id] = req
        try:
            with self._send_lock:
                self._send(req)
        except (BrokenPipeError, OSError):
            pass  # the reader thread restarts the process and sends pending requests again
        return fut

    def search(self, queries: Sequence[str], k: int, exclude_titles: Sequence[str | None] | None = None,
               forbidden: Collection[str] = ()) -> list[list[Passage]]:
        """Top-``k`` allowed passages per query (waits for the answer)."""
        return self.submit(queries, k, exclude_titles, forbidden).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._send_conn.send(("close",))
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        for c in (self._send_conn, self._recv_conn):
            c.close()
        self._log_dir.cleanup()

    def __enter__(self) -> "SearchProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


#: How often the search process checks that its parent is alive (seconds).
ORPHAN_POLL = 0.2


def exit_when_orphaned(parent: int, every: float = ORPHAN_POLL) -> threading.Thread:
    """Exit this process (its JVM with it) as soon as ``parent`` is no longer its parent: a parent killed
    mid-search would otherwise leave it running that search, and a JVM starting, for seconds."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(0)

    t = threading.Thread(target=watch, daemon=True, name="orphan-watch")
    t.start()
    return t


def serve(read_fd: int, write_fd: int, parent: int | None = None) -> None:
    """The child: open the retriever, then answer requests in order until ``close`` or EOF. It ignores Ctrl-C
    and SIGTERM sent to its process group (a terminal's Ctrl-C reaches every process of the group): its parent
    handles those and closes it, and it follows a parent that is gone (JVM included, which keeps ignored signals
    ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if parent is not None:
        exit_when_orphaned(parent)
    recv, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    _, index, k1, b, threads, max_heap = recv.recv()
    try:
        start_jvm(max_heap)
        retriever = BM25Retriever(index, k1=k1, b=b, threads=threads)
    except (ValueError, RuntimeError) as e:
        send.send(("error", str(e)))
        return
    send.send(("ready", {"num_docs": retriever.num_docs, "fingerprint": retriever.fingerprint()}))
    forbidden: dict[int, set[str]] = {}
    while True:
        try:
            msg = recv.recv()
        except EOFError:
            return
        if msg[0] == "close":
            return
        if msg[0] == "forbid":
            forbidden[msg[1]] = set(msg[2])
            continue
        _, rid, queries, k, exclude, fkey = msg
        try:
            res = retriever.search(queries, k, exclude_titles=exclude, forbidden=forbidden.get(fkey, ()))
            send.send(("ok", rid, res))
        except ValueError as e:
            send.send(("input_error", rid, str(e)))
        except Exception as e:  # noqa: BLE001 - report, keep serving
            send.send(("error", rid, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
