"""Every shipped YAML belongs to an entry point whose parser a test runs it through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# file-name prefix -> the test that parses such files with the entry point's own parser
PARSED_BY = {"fit": "tests/test_reranking.py::test_every_fit_config_parses",
             "build": "tests/test_data_gen.py::test_shipped_build_configs_parse",
             "ppl": "tests/test_eval_cli.py::test_shipped_ppl_configs_parse",
             "world": "tests/test_configs.py::test_demo_world_config_parses"}


def test_every_config_has_a_parser_test():
    for f in sorted((ROOT / "configs").rglob("*.yaml")):
        assert any(f.name.startswith(p) for p in PARSED_BY), f"{f} is parsed by no test; name it fit/build/ppl*.yaml"


def test_demo_world_config_parses():
    from demo.run import yaml_flags

    flags = yaml_flags(ROOT / "configs" / "demo" / "world.yaml")
    help_text = subprocess.run([sys.executable, "-m", "demo.world", "--help"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout
    for flag in flags[::2]:
        assert flag in help_text, f"configs/demo/world.yaml sets {flag}, which python -m demo.world does not take"
