"""Every shipped YAML belongs to an entry point whose parser a test runs it through."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# file-name prefix -> the test that parses such files with the entry point's own parser
PARSED_BY = {"fit": "tests/test_reranking.py::test_every_fit_config_parses",
             "build": "tests/test_data_gen.py::test_shipped_build_configs_parse",
             "ppl": "tests/test_ppl.py::test_shipped_ppl_configs_parse",
             "world": "tests/test_configs.py::test_demo_world_config_parses"}
#: configs/recipes/ holds the pipeline's recipes (any name)
RECIPES = "tests/test_pipeline.py::test_every_shipped_recipe_parses_into_a_plan"


def test_every_config_has_a_parser_test():
    for f in sorted((ROOT / "configs").rglob("*.yaml")):
        assert f.parent.name == "recipes" or any(f.name.startswith(p) for p in PARSED_BY), \
            f"{f} is parsed by no test; name it fit/build/ppl*.yaml or put a recipe in configs/recipes/"


def test_demo_world_config_parses():
    """demo.world's own parser reads configs/demo/world.yaml (an unknown key would fail) into its values."""
    from demo.world import world
    from ralm.cli import parse

    kwargs = parse(world, ["--config", str(ROOT / "configs" / "demo" / "world.yaml"), "--out", "x"], "demo.world")
    assert kwargs == {"out": "x", "seed": 0, "train_articles": 3000, "eval_articles": 8, "eval_people_in_train": True,
                      "dev_articles": 8, "heldout_articles": 8}
