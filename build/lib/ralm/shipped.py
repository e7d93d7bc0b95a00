"""The files the project ships beside its code, found in the source tree or inside an installed copy.

Commands and recipes name configs and the demo's LM as the source tree lays them out (``configs/fit.yaml``,
``demo/assets/lm``), relative to where the command runs. In an installed copy (``pip install .``) there is no
source tree: the wheel carries ``configs/`` as the package ``ralm.configs`` and the demo's LM as package data
of ``demo``, and :func:`locate` turns such a path that does not exist here into the installed file's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: The first part of a shipped path, and the package that holds the rest in an installed copy.
PACKAGES = {"configs": "ralm.configs", "demo": "demo"}


def locate(path: str | None) -> str | None:
    """``path`` itself when it exists (or is not a shipped path), else the installed copy's file."""
    if not path:
        return path
    p = Path(path)
    if p.exists() or p.is_absolute() or len(p.parts) < 2 or p.parts[0] not in PACKAGES:
        return path
    try:
        spec = importlib.util.find_spec(PACKAGES[p.parts[0]])
    except ImportError:
        return path
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = Path(root).joinpath(*p.parts[1:])
        if found.exists():
            return str(found)
    return path
