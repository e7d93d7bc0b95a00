"""An output directory belongs to one run at a time.

Two ``eval.ppl`` (or ``data_gen.build``, or ``reranking.fit`` exports) started on the same directory — a
user rerunning in a second terminal — would share resumable state and overwrite each other's files. The
first run holds an exclusive ``flock`` on ``DIR/.lock`` for its whole life; the second is refused at once
with the directory and the holder's pid, host and command. The kernel releases the lock when the holder
exits however it ends (SIGKILL included), so no stale lock survives a crash. A run that ends (or fails, or is
stopped) removes the lock file, and the directories it made when nothing was left in them: a command refused
at its first check leaves nothing behind. Only global rank 0 takes it: the other ranks of a distributed run
belong to the same run.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ralm.files import missing_dirs, remove_empty
from ralm.settings import InputError

LOCK = ".lock"


def global_rank() -> int:
    """This process's global rank from the launcher's environment (0 when not distributed)."""
    for key in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key):
            return int(os.environ[key])
    if int(os.environ.get("NODE_RANK", "0") or 0) > 0:
        return 1  # some rank on another node: not the one that writes
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


@contextmanager
def claim(directory: str | Path, flag: str) -> Iterator[None]:
    """Hold ``directory`` for this run (created if needed) while the block runs; ``flag`` names the setting
    in the error a second run gets."""
    if global_rank() != 0:
        yield
        return
    d = Path(directory)
    new = missing_dirs(d)
    try:
        d.mkdir(parents=True, exist_ok=True)
        f = open(d / LOCK, "a+", encoding="utf-8")
    except OSError as e:
        raise InputError(f"{flag} {str(d)!r} is not writable ({e.strerror or e}); pass a directory you can "
                         "write to") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise InputError(f"{flag} {d} is in use by {holder}; wait for that run to end (or stop it), or pass "
                             f"another {flag}") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
                f"({' '.join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]])[:300]})\n")
        f.flush()
        try:
            yield
        finally:  # still holding it: no other run can be between the check and the removal
            (d / LOCK).unlink(missing_ok=True)
            remove_empty(new)
    # closing the file released the lock
