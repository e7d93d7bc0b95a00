"""What each finished step was built from, so that a rerun notices a change instead of reusing stale work.

A step's *stamp* is a hash of its command (the run directory written ``OUT``, so a moved or differently spelled
``out`` is the same run) and of every input its command line names: a file by its content (texts, corpora,
YAMLs, scores files), a directory an earlier step wrote by that step's stamp (so a change flows downstream),
any other path by its name. The runner records a step's stamp under ``OUT/steps/`` when it finishes; a
finished step whose stamp is no longer the recorded one is *stale*: the pipeline stops before running anything
and names what changed and what to remove. A finished step with no record (a run from before stamps) is
taken as it is and recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pipeline.plan import Recipe, Step
from ralm.files import atomic_write, file_sha256


class Ledger:
    """The stamps of a recipe's steps: computed from the inputs on disk, compared with those recorded."""

    def __init__(self, r: Recipe, steps: list[Step]):
        self.r, self.steps = r, steps  # every step of the plan, in order: earlier ones produce later ones' inputs
        self.dir = r.root / "steps"
        self._hashes: dict[tuple, str] = {}

    # ------------------------------------------------------------------ computing
    def _file(self, p: Path) -> str:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._hashes:
            self._hashes[key] = file_sha256(p)
        return self._hashes[key]

    def _out(self, token: str) -> str:
        root = str(self.r.root)
        return token.replace(root, "OUT") if root not in ("", ".") else token

    def inputs(self, upto: Step) -> dict[str, str]:
        """Each input ``upto``'s command names, as ``{path as written (OUT/...): content hash or producer's stamp}``."""
        produced: dict[Path, str] = {}
        for s in self.steps:
            own = s.done.parent.resolve() if s.done is not None else None
            found: dict[str, str] = {}
            for token in s.argv:
                for part in token.strip("[]").split(","):
                    p = Path(part.strip())
                    if not part.strip() or part.startswith("-") or not p.exists() or p.resolve() == own:
                        continue
                    rp = p.resolve()
                    maker = next((h for d, h in produced.items() if rp == d or d in rp.parents), None)
                    found[self._out(part.strip())] = maker or (self._file(p) if p.is_file() else "a directory")
            if s == upto:
                return found
            if own is not None:
                produced[own] = self._stamp(s, found)
        raise ValueError(f"{upto.title}: not a step of this plan")

    def _stamp(self, s: Step, found: dict[str, str]) -> str:
        body = json.dumps([s.module, [self._out(a) for a in s.argv], sorted(found.items())])
        return hashlib.sha256(body.encode()).hexdigest()

    def stamp(self, s: Step) -> str:
        return self._stamp(s, self.inputs(s))

    # ------------------------------------------------------------------ the record
    def _path(self, s: Step) -> Path:
        key = hashlib.sha256(f"{s.stage}|{s.title}|{self._out(str(s.done))}".encode()).hexdigest()[:16]
        return self.dir / f"{s.stage}-{key}.json"

    def record(self, s: Step) -> None:
        """Note what a finished step was built from."""
        if s.done is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"step": f"{s.stage}: {s.title}", "command": self._out(s.command()), "stamp": self.stamp(s),
                           "inputs": self.inputs(s)}, indent=1)
        atomic_write(self._path(s), lambda t: Path(t).write_text(text))

    def stale(self, s: Step, adopt: bool = True) -> str | None:
        """Why a finished step no longer matches what it was built from (None: it matches, or is not finished).
        A finished step with no record is taken as it is (and recorded, with ``adopt``)."""
        if not s.finished():
            return None
        f = self._path(s)
        if not f.is_file():
            if adopt:
                self.record(s)
            return None
        old = json.loads(f.read_text())
        if old["stamp"] == self.stamp(s):
            return None
        now, before = self.inputs(s), old.get("inputs", {})
        changed = [k for k in sorted(set(now) | set(before)) if now.get(k) != before.get(k)]
        what = (f"{', '.join(changed)} changed" if changed else
                f"its command changed (was: {old['command']})")
        return f"{what} since it was built"


def describe_stale(s: Step, why: str) -> str:
    """The refusal: the step, what changed, and what to remove so that the same command rebuilds it."""
    out = s.done.parent if s.done is not None else None
    return (f"step '{s.stage}: {s.title}' is stale: {why}; its output {out} and the steps after it that read it "
            f"were built from the old inputs: remove {out}{os.sep} (and theirs) and rerun the same command, or "
            "give another out")
