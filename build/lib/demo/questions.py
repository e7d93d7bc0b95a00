"""``python -m demo.questions``: an offline QA set about the demo world's people, for ``python -m eval.qa``.

    python -m demo.world --out demo_out/world
    python -m demo.questions --world demo_out/world --out demo_out/qa/eval.jsonl --split eval

Each person has one encyclopedia passage in the corpus holding all their facts; the questions ask for
them (where the person lives, their trade, instrument, animal, favourite colour, year of birth), the gold
answer comes from ``people.json``. ``--split`` follows the demo's texts: ``eval`` asks about the people
of the evaluation texts, ``train`` about the others. Questions are drawn with ``--seed``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from ralm.cli import run
from ralm.settings import InputError

QUESTIONS = {
    "town": "Where does {name} live?",
    "occupation": "What is the trade of {name}?",
    "instrument": "Which instrument does {name} play?",
    "animal": "What animal does {name} keep?",
    "colour": "What is the favourite colour of {name}?",
    "year": "In which year was {name} born?",
}


def qa_set(out: str, world: str = "demo_out/world", split: str = "eval", questions: int = 200, seed: int = 0) -> str:
    """Write ``questions`` questions about the people of ``split`` as JSON lines.

    Args:
        out: The JSON-lines file to write.
        world: A folder written by ``python -m demo.world`` (its people.json).
        split: eval | train: whose facts are asked about.
        questions: How many questions (at most one per person and fact).
        seed: Seed of the draw.
    """
    people_file = Path(world) / "people.json"
    if not people_file.is_file():
        raise InputError(f"--world {world!r} has no people.json; write one with python -m demo.world --out {world}")
    if split not in ("eval", "train"):
        raise InputError(f"--split {split!r}: eval or train")
    people = [p for p in json.loads(people_file.read_text()) if p["split"] == split]
    pairs = [(p, fact) for p in people for fact in QUESTIONS]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    rows = [{"question": QUESTIONS[fact].format(name=f"{p['first']} {p['surname']}"), "answers": [str(p[fact])],
             "fact": fact, "person": f"{p['first']} {p['surname']}"} for p, fact in pairs[:questions]]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"{len(rows)} questions about {len(people)} {split} people -> {out}"


def main(argv: list[str] | None = None) -> int:
    return run(qa_set, argv, "python -m demo.questions", description=__doc__, after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
