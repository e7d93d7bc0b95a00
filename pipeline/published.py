"""``python -m pipeline.published``: the published tables written from the recipes' expected results.

    python -m pipeline.published            # rewrite every marked table of docs/RESULTS.md and README.md
    python -m pipeline.published --check    # change nothing; exit 1 naming each table that differs

A published table is a block between ``<!-- expected FILE MEASUREMENT TABLE -->`` and ``<!-- /expected -->``; its
text is that table of ``FILE`` (:mod:`pipeline.expected`), so a number is kept once, in the expected file that
``--verify`` checks runs against, and the documents follow it. The prose around the blocks is the authors'.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pipeline.expected import load, table
from ralm.cli import run
from ralm.settings import InputError

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- expected (\S+) (\S+) (\S+) -->\n)(.*?)(<!-- /expected -->)", re.S)


def rewrite(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """``text`` with every block's table written from its expected file, and the blocks that changed."""
    changed: list[str] = []
    cache: dict[str, dict] = {}

    def fill(m: re.Match) -> str:
        f, name, tid = m.group(2), m.group(3), m.group(4)
        data = cache.setdefault(f, load(root / f))
        body = "\n" + table(data, name, tid)["markdown"].strip() + "\n\n"
        if body != m.group(5):
            changed.append(f"{f} {name} {tid}")
        return m.group(1) + body + m.group(6)

    return BLOCK.sub(fill, text), changed


def published(files: list[str] | None = None, check: bool = False) -> int:
    """Write (or with ``check``, compare) the marked tables of ``files``.

    Args:
        files: The documents (default: docs/RESULTS.md and README.md).
        check: Change nothing; exit status 1 if any table differs from its expected file.
    """
    stale = []
    for f in files or ["docs/RESULTS.md", "README.md"]:
        path = ROOT / f if not Path(f).is_absolute() else Path(f)
        if not path.is_file():
            raise InputError(f"{f}: no such document")
        new, changed = rewrite(path.read_text())
        stale += [f"{f}: {c}" for c in changed]
        if changed and not check:
            path.write_text(new)
    for s in stale:
        print(("differs from its expected file: " if check else "written: ") + s)
    return 1 if check and stale else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = [a for i, a in enumerate(argv) for a in ((a, "true") if a == "--check" and (
        i + 1 == len(argv) or argv[i + 1].startswith("--")) else (a,))]  # a bare --check, as a flag
    return run(published, args, "python -m pipeline.published")


if __name__ == "__main__":
    sys.exit(main())
