"""A small synthetic world where the right passage matters (the offline demo's data).

Random tiny models cannot show that retrieval helps, so the demo trains a small LM on a world built
here. The world is a population of invented people; each has facts (occupation, home town, birth
year, instrument, animal, colour, siblings), and each fact type has its own vocabulary.

* **Corpus** (what BM25 searches): one short encyclopedia article per person, titled by the
  person's full name (``"Tomas Velkar"``), plus one article per town (titled by the town) that
  lists notable residents. Many people share a first name, a surname (siblings) and a town, and all
  articles reuse the same wording, so BM25's top hit for a query that names a person is often a
  sibling, a namesake or the town's list of residents rather than the person's own article.
* **Training / evaluation text**: raw-WikiText articles about *events* (`` = The Rindel Fair of
  1851 = ``) in which people appear and their facts are restated in other words and another order.
  The facts are unpredictable without the person's own article, so an LM that reads its context
  gains only from the right passage. Event headings are never corpus titles (METHOD §4 forbids
  retrieving passages titled like an evaluation heading). By default the people of the evaluation
  text never appear in the training text; ``eval_people_in_train=True`` (the demo's setting) lets the
  training text mention everyone, as Wikipedia's training articles mention the entities of its test
  articles. That is what lets a reranker learn who is who: measured, an encoder that only ever saw
  training-split people as positives preferred them over the unseen evaluation people and chose
  passages at BM25 ranks 5-7 (word ppl 6.48 against 6.18 with no retrieval). The demo LM is trained
  on other worlds, so it cannot memorise any fact of this one either way.

Everything is a pure function of the seed. CLI: ``python -m demo.world --out DIR`` writes
``corpus.txt`` (raw WikiText layout, one article per corpus passage), ``corpus.jsonl``
(``{"id", "title", "text", "contents"}`` with ``contents = title + "\\n" + text``), ``train.txt``,
``eval.txt``, ``people.json`` and, when asked for, ``dev.txt`` and ``heldout.txt``.
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ralm.cli import run

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kl", "st", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "k", "th", "nd", "rk"]

OCCUPATIONS = ("potter weaver baker smith tanner mason carpenter fisher miller brewer cooper glassblower "
               "chandler saddler tailor cobbler jeweller shipwright farmer herbalist scribe painter "
               "clockmaker ropemaker").split()
INSTRUMENTS = "lute harp fiddle flute drum horn zither bagpipe oboe trumpet cello mandolin lyre dulcimer".split()
ANIMALS = "heron goat falcon hound cat raven donkey tortoise ferret owl parrot pony swan badger".split()
COLOURS = "amber crimson indigo ochre teal scarlet violet olive saffron cobalt maroon silver".split()
EVENT_KINDS = "Fair Festival Market Regatta Tournament Council Carnival Feast Exhibition Gathering".split()
TOWN_TRAITS = ("its stone bridge|its old mill|its spring market|its harbour|its clock tower|its salt pans|"
               "its orchards|its river ferry|its wool trade|its chapel").split("|")


@dataclass
class Person:
    first: str
    surname: str
    female: bool
    occupation: str
    town: str
    year: int
    instrument: str
    animal: str
    colour: str
    siblings: list[str] = field(default_factory=list)  # full names
    split: str = "train"  # which text mentions this person: "train" or "eval"

    @property
    def name(self) -> str:
        return f"{self.first} {self.surname}"


@dataclass
class World:
    people: list[Person]
    towns: list[str]
    corpus: list[tuple[str, str]]  # (title, text)
    train_text: str
    eval_text: str
    dev_text: str = ""      # more events of the evaluation people: for choosing settings
    heldout_text: str = ""  # and more again: for reporting on text that no setting was chosen on


def _words(rng: random.Random, n: int, taken: set[str], syll=(2, 3)) -> list[str]:
    out = []
    while len(out) < n:
        k = rng.randint(*syll)
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(k - 1))
        w = (w + rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)).capitalize()
        if w not in taken and 4 <= len(w) <= 10:
            taken.add(w)
            out.append(w)
    return out


def _pronouns(p: Person) -> dict[str, str]:
    if p.female:
        return {"he": "she", "He": "She", "his": "her", "His": "Her", "him": "her", "sib": "sister"}
    return {"he": "he", "He": "He", "his": "his", "His": "His", "him": "him", "sib": "brother"}


def _passage(p: Person, rng: random.Random, by_name: dict[str, Person]) -> str:
    """The encyclopedia article about ``p`` (≈ 45-75 words, all its facts, shared wording)."""
    g = _pronouns(p)
    head = rng.choice([
        f"{p.name} is a {p.occupation} from {p.town} .",
        f"{p.name} ( born {p.year} ) is a {p.occupation} who lives in {p.town} .",
        f"{p.name} is a {p.occupation} and a member of the {p.town} guild .",
    ])
    rest = []
    if "born" not in head:
        rest.append(rng.choice([f"{g['He']} was born in {p.year} .", f"{p.surname} was born in the year {p.year} ."]))
    if p.town not in head:
        rest.append(rng.choice([f"{g['He']} lives in {p.town} .", f"{p.surname} has always lived in {p.town} ."]))
    rest.append(rng.choice([f"{g['He']} plays the {p.instrument} .", f"{p.surname} is known for playing the {p.instrument} .",
                            f"{g['He']} is a fine {p.instrument} player ."]))
    rest.append(rng.choice([f"{g['He']} keeps a {p.animal} .", f"{g['His']} companion is a {p.animal} .",
                            f"{p.surname} owns a {p.animal} ."]))
    rest.append(rng.choice([f"{g['His']} favourite colour is {p.colour} .", f"{p.surname} always wears {p.colour} .",
                            f"{g['He']} is fond of {p.colour} cloth ."]))
    rng.shuffle(rest)
    filler = rng.choice([
        f"Like many people in {p.town} , {g['he']} is known in the town .",
        f"The {p.occupation} trade is common in {p.town} .",
        f"{g['He']} is a well known figure in {p.town} and the nearby towns .",
        f"Many people in {p.town} know {g['him']} .",
    ])
    rest.insert(rng.randrange(len(rest) + 1), filler)
    if p.siblings:
        sibs = " and ".join(p.siblings)
        rest.append(f"{p.name} is the {g['sib']} of {sibs} .")
    return " ".join([head] + rest)


def _town_passage(town: str, residents: list[Person], rng: random.Random) -> str:
    """The article about a town: a list of residents (names, some occupations), no other facts."""
    trait = rng.choice(TOWN_TRAITS)
    parts = [f"{town} is a town known for {trait} .", f"Notable people from {town} include"]
    names = []
    for p in rng.sample(residents, min(len(residents), 9)):
        names.append(f"{p.name} , the {p.occupation} ," if rng.random() < 0.4 else f"{p.name} ,")
    parts.append(" ".join(names)[:-2] + " .")
    parts.append(f"Many people in {town} play music at the {town} fair .")
    return " ".join(parts)


def _mention(p: Person, rng: random.Random, by_name: dict[str, Person], n_facts: tuple[int, int] = (3, 6)) -> list[str]:
    """Sentences of an event article about ``p``: 3-6 of its facts, reworded and reordered."""
    g = _pronouns(p)
    s = p.surname
    intro = rng.choice([
        f"Among the guests was {p.name} .",
        f"{p.name} also came to the event .",
        f"One of the visitors was {p.name} .",
        f"The next to arrive was {p.name} .",
        f"{p.name} was there as well .",
    ])
    facts = [
        lambda: rng.choice([f"{s} works as a {p.occupation} .", f"By trade , {s} is a {p.occupation} .",
                            f"The {p.occupation} {p.name} greeted everyone ."]),
        lambda: rng.choice([f"{g['He']} had travelled from {p.town} .", f"{s} came from {p.town} .",
                            f"{g['He']} still lives in {p.town} ."]),
        lambda: rng.choice([f"{s} , who was born in {p.year} , spoke first .", f"Born in {p.year} , {s} was among the eldest .",
                            f"{g['He']} was born in {p.year} ."]),
        lambda: rng.choice([f"{g['He']} played the {p.instrument} at the opening .", f"{s} brought a {p.instrument} .",
                            f"Later {s} played the {p.instrument} for the crowd ."]),
        lambda: rng.choice([f"{g['His']} {p.animal} followed {g['him']} everywhere .", f"{s} arrived with a {p.animal} .",
                            f"The {p.animal} of {s} caused a stir ."]),
        lambda: rng.choice([f"{g['He']} was dressed in {p.colour} .", f"{s} wore {p.colour} as always .",
                            f"Everyone noticed the {p.colour} coat of {s} ."]),
    ]
    if p.siblings:
        sib = by_name[rng.choice(p.siblings)]
        facts.append(lambda: rng.choice([f"{s} came with {g['his']} {_pronouns(sib)['sib']} {sib.first} .",
                                         f"{g['His']} {_pronouns(sib)['sib']} {sib.first} stayed at home ."]))
    rng.shuffle(facts)
    n = rng.randint(min(n_facts[0], len(facts)), min(n_facts[1], len(facts)))
    return [intro] + [f() for f in facts[:n]]


def _event_articles(people: list[Person], towns: list[str], n_articles: int, rng: random.Random,
                    by_name: dict[str, Person], used_titles: set[str], n_facts: tuple[int, int] = (3, 6)) -> str:
    by_town: dict[str, list[Person]] = {}
    for p in people:
        by_town.setdefault(p.town, []).append(p)
    out = [" \n"]
    for _ in range(n_articles):
        while True:
            town = rng.choice(towns)
            title = f"The {town} {rng.choice(EVENT_KINDS)} of {rng.randint(1850, 1910)}"
            if title not in used_titles:
                used_titles.add(title)
                break
        out += [f" = {title} = \n", " \n"]
        kind = title.split()[2]
        intro = (f"The {town} {kind} was held in {town} in the spring . Many people from {town} and "
                 f"the nearby towns attended the {kind.lower()} .")
        out += [" " + intro + " \n", " \n"]
        for _ in range(rng.randint(2, 4)):  # paragraphs
            sents: list[str] = []
            guests: list[Person] = []
            for _ in range(rng.randint(2, 3)):
                if guests and guests[-1].siblings and rng.random() < 0.4:
                    cand = [by_name[n] for n in guests[-1].siblings if by_name[n].split == guests[-1].split]
                    p = rng.choice(cand) if cand else rng.choice(people)
                elif rng.random() < 0.6 and by_town.get(town):
                    p = rng.choice(by_town[town])
                else:
                    p = rng.choice(people)
                guests.append(p)
                sents += _mention(p, rng, by_name, n_facts)
            out += [" " + " ".join(sents) + " \n", " \n"]
    return "".join(out)


def make_world(n_families: int = 360, n_first: int = 24, n_towns: int = 24, n_train_articles: int = 3000,
               n_eval_articles: int = 30, eval_fraction: float = 0.2, eval_facts: tuple[int, int] = (3, 6),
               seed: int = 0, eval_people_in_train: bool = False, n_dev_articles: int = 0,
               n_heldout_articles: int = 0) -> World:
    """Build the whole world deterministically from ``seed``.

    Dev and held-out texts are drawn after everything else from their own random streams, so asking
    for them leaves the corpus, the training text and the evaluation text byte for byte as they were.
    """
    rng = random.Random(seed)
    taken: set[str] = set()
    firsts = _words(rng, n_first, taken, syll=(2, 2))
    female = {f: i % 2 == 1 for i, f in enumerate(firsts)}
    surnames = _words(rng, n_families, taken, syll=(2, 3))
    towns = _words(rng, n_towns, taken, syll=(2, 3))

    people: list[Person] = []
    for fam in surnames:
        size = rng.choice([1, 2, 2, 3, 3, 4])
        members = rng.sample(firsts, size)
        home = rng.choice(towns)
        split = "eval" if rng.random() < eval_fraction else "train"
        fam_people = []
        for f in members:
            town = home if rng.random() < 0.7 else rng.choice(towns)
            fam_people.append(Person(first=f, surname=fam, female=female[f], occupation=rng.choice(OCCUPATIONS),
                                     town=town, year=rng.randint(1790, 1889), instrument=rng.choice(INSTRUMENTS),
                                     animal=rng.choice(ANIMALS), colour=rng.choice(COLOURS), split=split))
        for p in fam_people:
            p.siblings = [q.name for q in fam_people if q is not p]
        people += fam_people
    by_name = {p.name: p for p in people}

    corpus: list[tuple[str, str]] = [(p.name, _passage(p, rng, by_name)) for p in people]
    for t in towns:
        residents = [p for p in people if p.town == t]
        if residents:
            corpus.append((t, _town_passage(t, residents, rng)))
    order = list(range(len(corpus)))
    rng.shuffle(order)
    corpus = [corpus[i] for i in order]

    used_titles = {t for t, _ in corpus}
    eval_people = [p for p in people if p.split == "eval"]
    train_people = [p for p in people if p.split == "train"]
    eval_text = _event_articles(eval_people, towns, n_eval_articles, random.Random(seed + 1), by_name, used_titles,
                                eval_facts)
    train_text = _event_articles(people if eval_people_in_train else train_people, towns, n_train_articles,
                                 random.Random(seed + 2), by_name, used_titles)
    dev_text = _event_articles(eval_people, towns, n_dev_articles, random.Random(seed + 3), by_name, used_titles,
                               eval_facts) if n_dev_articles else ""
    heldout_text = _event_articles(eval_people, towns, n_heldout_articles, random.Random(seed + 4), by_name,
                                   used_titles, eval_facts) if n_heldout_articles else ""
    return World(people=people, towns=towns, corpus=corpus, train_text=train_text, eval_text=eval_text,
                 dev_text=dev_text, heldout_text=heldout_text)


def corpus_wikitext(corpus: list[tuple[str, str]]) -> str:
    """The corpus in raw WikiText layout: one `` = Title = `` article of one paragraph per passage."""
    out = [" \n"]
    for title, text in corpus:
        out += [f" = {title} = \n", " \n", f" {text} \n", " \n"]
    return "".join(out)


def headings(text: str) -> list[str]:
    """Top-level article headings (`` = Title = `` lines) of a raw WikiText string."""
    out = []
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith("= ") and s.endswith(" =") and not s.startswith("= ="):
            out.append(s[2:-2].strip())
    return out


def mentions(text: str, names) -> list[tuple[int, str]]:
    """``(char_end, full_name)`` of every full-name mention in ``text``, in order.

    The person mentioned last before a position is the one the upcoming tokens are about (until the
    next mention), so this labels which corpus passage is "right" for any stride of the text.
    """
    rx = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    return [(m.end(), m.group(1)) for m in rx.finditer(text)]


def write_world(world: World, out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f for k, f in [("corpus_txt", "corpus.txt"), ("corpus_jsonl", "corpus.jsonl"),
                                     ("train", "train.txt"), ("eval", "eval.txt"), ("people", "people.json")]}
    paths["corpus_txt"].write_text(corpus_wikitext(world.corpus), encoding="utf-8")
    with paths["corpus_jsonl"].open("w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(world.corpus):
            f.write(json.dumps({"id": str(i), "title": title, "text": text, "contents": f"{title}\n{text}"}) + "\n")
    paths["train"].write_text(world.train_text, encoding="utf-8")
    paths["eval"].write_text(world.eval_text, encoding="utf-8")
    for name, text in (("dev", world.dev_text), ("heldout", world.heldout_text)):
        if text:
            paths[name] = out / f"{name}.txt"
            paths[name].write_text(text, encoding="utf-8")
    paths["people"].write_text(json.dumps([asdict(p) for p in world.people], indent=0), encoding="utf-8")
    return paths


def world(out: str, seed: int = 0, train_articles: int = 3000, eval_articles: int = 30,
          eval_people_in_train: bool = False, dev_articles: int = 0, heldout_articles: int = 0) -> str:
    """Write a synthetic world's corpus and texts.

    Args:
        out: Output folder (corpus.txt, train.txt, eval.txt, dev.txt, heldout.txt, people.json).
        seed: The world's seed: everything is a pure function of it and of the counts below.
        train_articles: Events written to train.txt.
        eval_articles: Events written to eval.txt.
        eval_people_in_train: true: the training text may mention the people of the evaluation text too.
        dev_articles: Events written to dev.txt, for choosing settings.
        heldout_articles: Events written to heldout.txt, for reporting on text no setting was chosen on.
    """
    w = make_world(n_train_articles=train_articles, n_eval_articles=eval_articles, seed=seed,
                   eval_people_in_train=eval_people_in_train, n_dev_articles=dev_articles,
                   n_heldout_articles=heldout_articles)
    paths = write_world(w, out)
    return "\n".join([f"{len(w.people)} people, {len(w.corpus)} passages, train {len(w.train_text.split())} words, "
                      f"eval {len(w.eval_text.split())} words -> {out}", *(f"  {k}: {p}" for k, p in paths.items())])


def main(argv: list[str] | None = None) -> int:
    return run(world, argv, "python -m demo.world", description=__doc__, after=lambda msg, kw: print(msg) or 0)


if __name__ == "__main__":
    sys.exit(main())
