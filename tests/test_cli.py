"""Every ``python -m`` entry point: ``--help`` works and stays fast because the command module is thin (it imports
settings, not torch, Lightning, transformers or datasets; those load when the command runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "lightning", "transformers", "datasets")
PROBE = """
import runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert e.code in (0, None), e.code
print("HEAVY:" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def entry_points() -> list[str]:
    """The user's commands: modules of the product packages with a ``main`` that run as ``python -m`` (a
    ``__main__`` block or ``__main__.py``; ralm.search_process is the search's own subprocess, not a command)."""
    found = []
    for pkg in ("ralm", "data_gen", "reranking", "eval", "demo", "pipeline"):
        for f in sorted((ROOT / pkg).glob("*.py")):
            if f.name == "__main__.py":
                found.append(pkg)
            elif 'if __name__ == "__main__":' in f.read_text() and "\ndef main(" in f.read_text():
                found.append(f"{pkg}.{f.stem}")
    return found


def test_the_entry_points_are_found():
    assert {"pipeline", "data_gen.build", "reranking.fit", "eval.ppl", "eval.compare", "ralm.corpus",
            "ralm.models"} <= set(entry_points())


@pytest.mark.parametrize("module", entry_points())
def test_help_is_fast_because_the_command_is_thin(module, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}  # reranking.fit keeps its --help text here
    cmd = [sys.executable, "-c", PROBE.format(heavy=HEAVY), module]
    if module == "reranking.fit":  # LightningCLI builds its parser from Lightning: the text is cached once
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, check=True)
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]
    assert p.stdout.rstrip().endswith("HEAVY:"), f"{module} --help imported {p.stdout.rsplit('HEAVY:', 1)[1]}"
    assert seconds < 3, f"{module} --help took {seconds:.1f}s"


def test_the_console_command_lists_every_entry_point():
    from ralm.commands import COMMANDS

    assert set(COMMANDS) == set(entry_points()) - {"ralm.commands"}


def test_an_installed_wheel_runs_a_shipped_recipe_from_anywhere(tmp_path):
    """``pip install .`` without the source tree: the wheel carries configs/ and the demo's LM, its console
    command runs each entry point, and a recipe named as in the source tree is found in the installed copy."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("ralm_rerank-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def ralm_rerank(*args):
        return subprocess.run([sys.executable, str(site / "bin" / "ralm-rerank"), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True)

    listing = ralm_rerank()
    assert listing.returncode == 0 and "reranking.fit" in listing.stdout and "pipeline" in listing.stdout
    plan = ralm_rerank("pipeline", "--config", "configs/recipes/demo.yaml", "--print_plan")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert f"--config {site / 'ralm' / 'configs' / 'demo' / 'fit.yaml'}" in plan.stdout
    assert f"--model {site / 'demo' / 'assets' / 'lm'}" in plan.stdout
    assert (site / "demo" / "assets" / "lm" / "model.safetensors").is_file()
    assert ralm_rerank("nope").returncode == 2
    assert not any(elsewhere.iterdir())


def test_the_help_of_a_group_inside_a_group(capsys):
    """``--texts.help`` lists ``--texts.train.help``: it shows that group's settings, exit 0."""
    from pipeline.__main__ import main

    assert main(["--texts.train.help"]) == 0
    out = capsys.readouterr().out
    assert "--texts.train.file FILE" in out and "A text as the user has it" in out


@pytest.mark.parametrize("module", ["eval.ppl", "data_gen.build", "reranking.fit", "pipeline"])
def test_a_sigterm_before_the_work_begins_is_one_line_and_143(module, tmp_path):
    """A command stopped by SIGTERM while it is still reading its settings (here: a --config that is a FIFO nobody
    writes) exits 143 with one line, as a stop during its work does; not killed silently (-15)."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-m", module, "--config", str(fifo)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 60  # until it waits in open() for the FIFO's writer
    while time.time() < deadline and open(f"/proc/{p.pid}/wchan").read() != "wait_for_partner":
        time.sleep(0.05)
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    assert err.strip().splitlines() == [f"python -m {module}: stopped by SIGTERM; what was finished is kept: rerun the "
                                        "same command to continue"], err
