"""Writing files so that nothing half-written ever sits under a final name.

Every output is written to a temporary name in its final folder, fsynced and moved in place with
``os.replace`` (atomic on POSIX): a SIGKILL leaves the previous state, and a full disk or a
read-only directory is one :class:`~ralm.settings.InputError` naming the file, never a truncated one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

from ralm.settings import InputError


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


#: The mode of a new file under the process's umask (0644 under the usual 022).
FILE_MODE = _file_mode()


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` then fsync and rename to ``path`` (its folder is created)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)  # as any new file (a library may have written it 0600)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"could not write {path}: {e.strerror or e}. Free some space or fix the permissions, then "
                         "rerun the same command: finished work is kept") from None


def missing_dirs(directory: str | Path) -> list[Path]:
    """The directories ``mkdir(parents=True)`` would create for ``directory``, deepest first."""
    d = Path(directory)
    return [p for p in (d, *d.parents) if not p.exists()]


def remove_empty(dirs: list[Path]) -> None:
    """Remove directories :func:`missing_dirs` listed, deepest first, up to the first that holds anything."""
    for p in dirs:
        if any(p.iterdir()):
            return
        p.rmdir()


def check_writable(directory: str | Path, flag: str) -> None:
    """Fail before any heavy work if ``directory`` cannot be created or written (``flag`` names the setting);
    what the check creates, it removes (:func:`ralm.lock.claim` creates the directory for the run)."""
    d = Path(directory)
    new = missing_dirs(d)  # made for the probe only: removed again
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
        remove_empty(new)
    except OSError as e:
        raise InputError(f"{flag} {str(d)!r} is not writable ({e.strerror or e}); pass a directory you can "
                         "write to") from None


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (model weights, shards, outputs), streamed by ``hashlib.file_digest``."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
