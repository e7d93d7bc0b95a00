"""A recipe's expected results kept as data beside it (``configs/recipes/NAME.expected.yaml``), and the check of a
finished run against them (``python -m pipeline --config RECIPE --verify``), the way Pyserini's two-click
reproductions keep theirs.

An expected file holds one or more *measurements* (a precision on a kind of machine: float32 tables are the same on
every CPU, bf16 ones move with the hardware), each with its command, its tolerances and its tables: the report
stage's Markdown tables pasted whole, so ``docs/RESULTS.md`` prints them from here (:mod:`pipeline.published`) and
no number is typed twice. The figures checked are read back from those tables and from the run's own tables with
one parser: each row's value (word perplexity, or nats a target on the held-out judge) and each change against a
baseline with its interval. A figure is OK within the tight tolerance, OKISH within the loose one or better (lower),
FAIL otherwise or when the run lacks it; a run of another kind (precision, or CPU / GPU) is judged with the
measurement's ``other`` tolerances and the check says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ralm.settings import InputError

#: The kinds of machine a measurement is of (see :func:`kind`).
DEVICES = ("CPU with native bf16", "CPU without native bf16", "GPU")
#: The judge's tables in a finished run (relative to its out).
SOURCES = {"judge": ("judge/judge.md", "judge/curve.md")}
GRADES = ("OK", "OKISH", "FAIL")


@dataclass(frozen=True)
class Tolerance:
    """|run − expected| allowed: ``value`` relative (of a perplexity or nats), ``change`` in the table's own unit
    (percentage points of a change in perplexity, or nats on the judge), for OK and for OKISH."""
    value: float
    change: float
    okish_value: float
    okish_change: float


def kind(precision: str, device: str) -> str:
    """A measurement's machine kind: float32 is one kind on every CPU (its tables are the same on AVX2 and AMX
    CPUs, measured); bf16 depends on whether the CPU runs it natively."""
    return "float32 on a CPU" if precision == "float32" and device != "GPU" else f"{precision} on a {device}"


def run_kind(root: Path, setting: str) -> tuple[str, str]:
    """(precision, device) of the finished run under ``root``: the precision its evaluations recorded (a run
    with none, e.g. judge only: ``setting`` resolved here), the device this machine's."""
    import torch  # the resolution needs it; reading a finished run's tables does not

    from ralm.precision import native_bf16, resolve

    cuda = torch.cuda.is_available()
    device = "GPU" if cuda else "CPU with native bf16" if native_bf16("cpu")[0] else "CPU without native bf16"
    recorded = next((json.loads(f.read_text()).get("precision") for f in sorted(root.glob("ppl/*/*/results.json"))),
                    None)
    return (recorded.split()[0] if recorded else resolve(setting, "cuda" if cuda else "cpu").dtype), device


def load(path: str | Path) -> dict:
    """An expected file, checked: every measurement has a name, a command, a precision and device, both
    tolerances, and tables of Markdown each; anything else is refused with the file and the entry named."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"expected results {p}: no such file (write one from a finished run: python -m pipeline "
                         "--config RECIPE --expect)")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"expected results {p}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise InputError(f"expected results {p}: needs 'recipe' and a list 'measurements'")
    for i, m in enumerate(data["measurements"]):
        where = f"expected results {p}, measurement {i}"
        missing = [k for k in ("name", "command", "precision", "device", "tolerance", "tables") if k not in m]
        if missing:
            raise InputError(f"{where}: missing {', '.join(missing)}")
        if m["device"] not in DEVICES:
            raise InputError(f"{where}: device {m['device']!r}: one of {', '.join(DEVICES)}")
        for side in ("same", "other"):
            try:
                Tolerance(**m["tolerance"][side])
            except (KeyError, TypeError):
                raise InputError(f"{where}: tolerance.{side} needs value, change, okish_value, okish_change") from None
        for t in m["tables"]:
            if not {"id", "markdown"} <= set(t) or not parse(t["markdown"]):
                raise InputError(f"{where}: table {t.get('id')!r} needs an id and a Markdown table")
    return data


def measurement(data: dict, name: str) -> dict:
    for m in data["measurements"]:
        if m["name"] == name:
            return m
    raise InputError(f"no measurement {name!r} (there are: {', '.join(m['name'] for m in data['measurements'])})")


def table(data: dict, name: str, table_id: str) -> dict:
    for t in measurement(data, name)["tables"]:
        if t["id"] == table_id:
            return t
    raise InputError(f"measurement {name!r} has no table {table_id!r}")


# --- reading figures back from Markdown tables ---------------------------------------------------------------

_NUM = r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-]?\d+)?"
_CELL = re.compile(rf"^({_NUM})\s*%?\s*(?:\[({_NUM}),\s*({_NUM})\])?")
_VS = re.compile(r"^vs (.+?)(?: \(GPU run\))?(?: \[95% CI\])?(?: \(p\))?$")
#: Header cells naming a table's rows, and its value column (word perplexity; nats a target on the judge).
RUN_COLUMNS = ("run", "reranker", "fit")
VALUE_COLUMNS = ("word ppl", "mean -log p(y given chosen d)", "mean")


def parse(md: str) -> list[list[list[str]]]:
    """The Markdown tables in ``md``: each a list of rows of cells (the header first, the rule left out)."""
    tables, rows = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _number(s: str) -> float:
    return float(s.replace("−", "-").replace(",", ""))


def _plain(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").strip()


def figures(md: str, names: dict[str, str] | None = None) -> dict[tuple, tuple]:
    """The checkable figures of the tables in ``md``: ``(row, "value") → (v,)`` and ``(row, "vs", baseline) →
    (change, low, high)`` (bounds None where the cell has no interval); ``names`` maps a table's labels (rows and
    baselines) to the run's. Tables whose rows are not runs (e.g. one row per text) have none."""
    names = names or {}
    out: dict[tuple, tuple] = {}
    for rows in parse(md):
        head = [_plain(h) for h in rows[0]]
        run = next((i for i, h in enumerate(head) if h in RUN_COLUMNS), None)
        if run is None:
            continue
        value = next((i for i, h in enumerate(head) if h in VALUE_COLUMNS), None)
        # "vs none" alone is every table's change without an interval; "vs none [95% CI]" is a baseline's column
        vs = {i: m.group(1) for i, h in enumerate(head) if (m := _VS.match(h)) and h != "vs none"}
        for cells in rows[1:]:
            label = _plain(cells[run])
            label = names.get(label, label)
            if value is not None and (m := _CELL.match(_plain(cells[value]))):
                out[(label, "value")] = (_number(m.group(1)),)
            for i, base in vs.items():
                if m := _CELL.match(_plain(cells[i])):
                    out[(label, "vs", names.get(base, base))] = tuple(
                        _number(g) if g is not None else None for g in m.groups())
    return out


def run_figures(root: Path, table_id: str, where: str) -> tuple[dict[tuple, tuple], list[Path]]:
    """The figures of a finished run that an expected table is checked against, and the files read: the run's
    table of the same id (``report/TEXT/vs-X/comparison.md``, ``judge/judge.md``, ``judge/curve.md``), or for a
    table put together from several (``where`` names them: a report text, or ``judge``) all of them."""
    same = [f for f in (root / "report" / table_id / "comparison.md", root / "judge" / f"{table_id}.md") if f.is_file()]
    files = same or ([root / f for f in SOURCES[where]] if where in SOURCES
                     else sorted((root / "report" / where).glob("vs-*/comparison.md")))
    found = [f for f in files if f.is_file()]
    out: dict[tuple, tuple] = {}
    for f in found:
        out |= figures(f.read_text())
    return out, found


# --- the check -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Line:
    grade: str
    table: str
    what: str
    run: str
    expected: str
    diff: str

    def __str__(self) -> str:
        return f"{self.grade:<6} {self.table:<22} {self.what:<48} {self.run:<28} expected {self.expected} ({self.diff})"


def _grade(diffs: list[float], ok: float, okish: float) -> str:
    worst = max(abs(d) for d in diffs)
    if worst <= ok + 1e-9:
        return "OK"
    return "OKISH" if worst <= okish + 1e-9 or all(d <= ok + 1e-9 for d in diffs) else "FAIL"


def _show(fig: tuple, unit: str) -> str:
    if len(fig) == 1:
        return f"{fig[0]:.3f}"
    c, lo, hi = fig
    return f"{c:+.{3 if unit == 'nats' else 1}f}{'' if unit == 'nats' else '%'}" + (
        f" [{lo:+.{3 if unit == 'nats' else 1}f}, {hi:+.{3 if unit == 'nats' else 1}f}]" if lo is not None else "")


def verify(data: dict, root: Path, run_kind: str) -> tuple[list[str], list[Line]]:
    """Check the finished run under ``root`` against the measurement of its kind (or the first, with the other
    tolerances): a header, then one line per expected figure."""
    if not data["measurements"]:
        raise InputError(f"{data.get('recipe')}: no expected results recorded yet; after a finished run, write them "
                         "with python -m pipeline --config RECIPE --expect")
    same = [m for m in data["measurements"] if kind(m["precision"], m["device"]) == run_kind]
    m = same[0] if same else data["measurements"][0]
    tol = Tolerance(**m["tolerance"]["same" if same else "other"])
    unit = "nats" if all(t.get("where") in ("judge", None) for t in m["tables"]) else "percentage points"
    head = [f"verifying {root} against {data['recipe']}'s measurement {m['name']!r} "
            f"({kind(m['precision'], m['device'])}, {m.get('machine', 'machine not recorded')})",
            f"this run: {run_kind}: " + ("the same kind" if same else "another kind, judged with the looser "
                                         "tolerances for another machine")
            + f"; OK within {tol.value:.2%} of a value and {tol.change} {unit} of a change, OKISH within "
              f"{tol.okish_value:.2%} and {tol.okish_change} (or better)"]
    lines = []
    for t in m["tables"]:
        where = t.get("where")
        if not where:
            continue
        unit = "nats" if where == "judge" else "%"
        have, files = run_figures(root, t["id"], where)
        for key, exp in figures(t["markdown"], t.get("names")).items():
            what = f"{key[0]} " + ("value" if key[1] == "value" else f"vs {key[2]}")
            got = have.get(key)
            if got is None:
                lines.append(Line("FAIL", t["id"], what, "missing from the run", _show(exp, unit),
                                  f"not in {', '.join(str(f) for f in files) or root / 'report' / where}"))
                continue
            if key[1] == "value":
                diffs = [(got[0] - exp[0]) / exp[0]]
                grade = _grade(diffs, tol.value, tol.okish_value)
                diff = f"{diffs[0]:+.3%}"
            else:
                diffs = [g - e for g, e in zip(got, exp) if g is not None and e is not None]
                grade = _grade(diffs, tol.change, tol.okish_change)
                diff = "largest " + f"{max(diffs, key=abs):+.3f}"
            lines.append(Line(grade, t["id"], what, _show(got, unit), _show(exp, unit), diff))
    return head, lines


def report_text(head: list[str], lines: list[Line]) -> str:
    counts = {g: sum(x.grade == g for x in lines) for g in GRADES}
    return "\n".join([*head, *map(str, lines), ", ".join(f"{n} {g}" for g, n in counts.items())
                      + (" — nothing to check: the run has none of the tables" if not lines else "")]) + "\n"


# --- writing a measurement from a finished run ---------------------------------------------------------------

def _block(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    """Multi-line strings (the tables) as YAML block scalars, so an expected file reads like the report."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _block)


def dump(data: dict) -> str:
    return (f"# The expected results of {data['recipe']} (pipeline/expected.py): each measurement's command,\n"
            "# machine, tolerances and report tables. `python -m pipeline --config RECIPE --verify` checks a finished\n"
            "# run against them, `--expect` records a run here, `python -m pipeline.published` prints the tables into\n"
            "# docs/RESULTS.md and README.md.\n"
            + yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=200))


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def measure(root: Path, texts: list[str], precision: str, device: str, command: str, machine: str) -> dict:
    """A measurement of the finished run under ``root``: each text's comparison tables and the judge's, as the
    report stage wrote them, with default tolerances (tight on the same kind of machine: the tables' rounding)."""
    tables = [{"id": f"{text}/{f.parent.name}", "where": text, "markdown": f.read_text().rstrip() + "\n"}
              for text in texts for f in sorted((root / "report" / text).glob("vs-*/comparison.md"))]
    tables += [{"id": Path(f).stem if f != "judge/judge.md" else "judge", "where": "judge",
                "markdown": (root / f).read_text().rstrip() + "\n"} for f in SOURCES["judge"] if (root / f).is_file()]
    if not tables:
        raise InputError(f"{root} has no report tables yet (report/TEXT/vs-*/comparison.md, judge/judge.md): "
                         "finish the run first")
    nats = all(t["where"] == "judge" for t in tables)
    return {"name": _slug(kind(precision, device)), "command": command, "precision": precision, "device": device,
            "machine": machine,
            "tolerance": {"same": {"value": 0.0002, "change": 0.002 if nats else 0.1,
                                   "okish_value": 0.005, "okish_change": 0.05 if nats else 1.0},
                          "other": {"value": 0.005, "change": 0.05 if nats else 0.5,
                                    "okish_value": 0.02, "okish_change": 0.2 if nats else 2.0}},
            "tables": tables}


def record(path: Path, recipe: str, m: dict) -> None:
    """Put measurement ``m`` into the expected file at ``path``. It replaces the measurement of its kind, keeping
    that one's name, tolerances and the tables no run has (``where`` empty: published, not checked)."""
    data = load(path) if path.is_file() else {"recipe": recipe, "measurements": []}
    same = lambda x: kind(x["precision"], x["device"]) == kind(m["precision"], m["device"])  # noqa: E731
    old = next((x for x in data["measurements"] if same(x)), None)
    if old:
        m = m | {"name": old["name"], "tolerance": old["tolerance"],
                 "tables": m["tables"] + [t for t in old["tables"] if not t.get("where")]}
    data["measurements"] = [m if x is old else x for x in data["measurements"]] + ([] if old else [m])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(data))
