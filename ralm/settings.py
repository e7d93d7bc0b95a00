"""Settings every entry point shares, each default written once (the paper's values, METHOD §1).

Small frozen dataclasses that check themselves. Every CLI is generated from typed signatures that
take these groups (:mod:`ralm.cli`), so a concept has one flag name and one YAML key everywhere
(``--windows.stride``, ``windows: {stride: 4}``) and a bad value gets the same message from every
entry point. Importing this module is cheap (no torch), which keeps ``--help`` fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ralm.errors import InputError, SettingsError

__all__ = ["InputError", "SettingsError", "Windows", "Retrieval", "Scoring", "Text", "Devices", "EncoderInput",
           "Ranker", "RERANKER_NAMES", "WIKITEXT103_TEST", "WIKITEXT103_TRAIN", "as_dict"]


def _fail(problems: list[str], group: str) -> None:
    if problems:
        raise SettingsError(f"invalid {group} settings: " + "; ".join(problems))


def _positive(obj, group: str, names: tuple[str, ...]) -> list[str]:
    return [f"--{group}.{n} must be >= 1 (got {getattr(obj, n)})" for n in names if getattr(obj, n) < 1]


#: Where an LM row's BOS comes from (:attr:`Windows.bos`).
BOS_MODES = ("every_row", "passage")


@dataclass(frozen=True)
class Windows:
    """How the frozen LM reads text: strided windows whose first positions hold the document (METHOD §2).

    Args:
        stride: s: retrieval happens every s tokens; in data generation, the target tokens per example.
        max_length: L: tokens per LM window (clipped to the model's context).
        doc_max_tokens: Document budget: a passage is cut to this many LM tokens.
        zero_shot_tokens: s': zero-shot ranking scores a candidate by the NLL of this many prefix tokens.
        bos: For an LM whose tokenizer puts a BOS token before every text (Gemma, Llama): every_row: each LM row
            starts with exactly one, with or without a passage (the passage's own BOS, never a second), taking one
            of the L positions as a passage's tokens do: the text read as the LM was trained. passage: only rows
            with a passage have one, from the passage's encoding (the reference code; for parity with its
            published numbers). No effect where the tokenizer adds none (GPT-2, SmolLM2).
    """

    stride: int = 4
    max_length: int = 1024
    doc_max_tokens: int = 256
    zero_shot_tokens: int = 16
    bos: str = "every_row"

    def __post_init__(self) -> None:
        p = _positive(self, "windows", ("stride", "doc_max_tokens", "zero_shot_tokens"))
        if self.bos not in BOS_MODES:
            p.append(f"--windows.bos must be every_row or passage (got {self.bos!r})")
        if self.max_length < 2:
            p.append(f"--windows.max_length must be >= 2 (got {self.max_length})")
        if not p:
            p += self._fit_problems(self.max_length, "--windows.max_length", documents=False)
        _fail(p, "windows")

    def _fit_problems(self, length: int, what: str, documents: bool) -> list[str]:
        if self.stride > length:
            return [f"--windows.stride ({self.stride}) exceeds the window L = {what} ({length}): tokens would go "
                    "unscored; lower --windows.stride"]
        if documents and self.doc_max_tokens >= length - self.stride:
            return [f"--windows.doc_max_tokens ({self.doc_max_tokens}) must be < L - s = {what} - --windows.stride "
                    f"({length} - {self.stride}): a document may not overwrite the target tokens; lower "
                    "--windows.doc_max_tokens or raise --windows.max_length"]
        return []

    def fitted(self, context: int, documents: bool = True) -> int:
        """L for a model whose context is ``context`` (``min(L, context)``, as the reference), re-checked;
        the document budget only where documents are placed (not for retrieval alone)."""
        length = min(self.max_length, context)
        what = "--windows.max_length" if length == self.max_length else f"the model's context ({context})"
        _fail(self._fit_problems(length, what, documents), "windows")
        return length


@dataclass(frozen=True)
class Retrieval:
    """BM25 candidates from Pyserini (Lucene): a prebuilt index or one built by ``python -m ralm.corpus``.

    Args:
        index: Lucene index directory (``python -m ralm.corpus --out DIR`` makes DIR/index) or a Pyserini
            prebuilt index name such as wikipedia-dpr-100w (downloaded on first use).
        k: Candidates per query.
        query_tokens: l: the query is the decoded last l LM tokens before the targets (only the past).
        k1: BM25 k1.
        b: BM25 b.
        forbid_eval_titles: Never retrieve passages titled like an article (`` = Title = `` heading) of the
            evaluated text (METHOD §4).
    """

    index: str | None = "wikipedia-dpr-100w"
    k: int = 16
    query_tokens: int = 32
    k1: float = 0.9
    b: float = 0.4
    forbid_eval_titles: bool = True

    def __post_init__(self) -> None:
        p = _positive(self, "retrieval", ("k", "query_tokens"))
        if not self.k1 > 0 or not 0 <= self.b <= 1:
            p.append(f"BM25 needs --retrieval.k1 > 0 and 0 <= --retrieval.b <= 1 (got k1={self.k1}, b={self.b})")
        _fail(p, "retrieval")

    def check_windows(self, windows: Windows, length: int | None = None) -> None:
        """The query comes from the prefix the LM reads: ℓ <= L - s."""
        length = windows.max_length if length is None else length
        if self.query_tokens > length - windows.stride:
            _fail([f"--retrieval.query_tokens ({self.query_tokens}) must be <= L - s ({length} - {windows.stride}): "
                   "the query is taken from the prefix the LM reads; lower --retrieval.query_tokens"], "retrieval")


#: What ``--reranker`` takes besides the path of a trained reranker (eval.rerankers builds them).
RERANKER_NAMES = ("none", "bm25", "first", "random", "zero-shot", "oracle", "zero-shot-abstain", "oracle-abstain",
                  "cosine")

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # Accelerate's placement strategies


@dataclass(frozen=True)
class Scoring:
    """How the frozen LM's forward passes run (which devices: the ``trainer`` group).

    Args:
        batch_size: Rows ([document ; window]) per LM forward.
        dtype: auto (bf16 autocast where the GPU or CPU runs bf16 natively, float32 elsewhere; see
            ralm.precision), float32, bfloat16 or float16.
        device_map: For an LM larger than one device: ``auto`` (or balanced, balanced_low_0, sequential)
            spreads its layers over this machine's GPUs, then CPU memory, then disk (Accelerate's big-model
            inference), or a map of module names to a GPU index, cpu or disk. One process then drives
            every device, so it runs with one Lightning device (--trainer.devices 1 or auto).
        max_memory: With device_map: the most each device may hold, e.g. {0: 70GiB, 1: 70GiB, cpu: 200GiB}.
    """

    batch_size: int = 16
    dtype: str = "auto"
    device_map: str | dict[str, int | str] | None = None
    max_memory: dict[str, int | str] | None = None

    def __post_init__(self) -> None:
        p = _positive(self, "scoring", ("batch_size",))
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            p.append(f"--scoring.dtype must be auto, float32, bfloat16 or float16 (got {self.dtype!r})")
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAPS:
            p.append(f"--scoring.device_map must be one of {', '.join(DEVICE_MAPS)} or a map of module names to "
                     f"devices (got {self.device_map!r})")
        if self.max_memory is not None and self.device_map is None:
            p.append("--scoring.max_memory needs --scoring.device_map (e.g. auto)")
        _fail(p, "scoring")


@dataclass(frozen=True)
class Text:
    """A text to read: a local file (read as is) or a Hugging Face dataset split (rows joined as the raw file).

    Args:
        file: A local text file in raw WikiText layout (overrides dataset).
        dataset: Hugging Face dataset (null: none).
        name: Its configuration (wikitext-103-v1 is the <unk> version the paper's numbers use).
        split: Its split.
    """

    file: str | None = None
    dataset: str | None = "wikitext"
    name: str | None = "wikitext-103-v1"
    split: str = "test"

    @property
    def given(self) -> bool:
        return bool(self.file) or bool(self.dataset and self.dataset.lower() not in ("none", "null"))

    def describe(self) -> str:
        return self.file if self.file else f"{self.dataset}/{self.name}/{self.split}"

    def load(self) -> str:
        from ralm.text import load_text

        return load_text(self.dataset, self.name, self.split, self.file)


#: The paper's evaluation text (WikiText-103 test, <unk> version) and its training text (raw train).
WIKITEXT103_TEST = Text()
WIKITEXT103_TRAIN = Text(name="wikitext-103-raw-v1", split="train")


@dataclass(frozen=True)
class Devices:
    """Lightning Trainer flags of a prediction run: one device, N devices and several nodes are the same
    command with these changed.

    Args:
        accelerator: cpu, gpu, cuda or auto.
        devices: Number of devices per node, a list, or auto.
        num_nodes: Number of nodes.
        strategy: auto, ddp, ddp_spawn, ...
    """

    accelerator: str = "auto"
    devices: int | str = "auto"
    num_nodes: int = 1
    strategy: str = "auto"

    def kwargs(self, one_process: bool = False) -> dict:
        """Trainer arguments. ``one_process``: the LM is spread over the devices by ``--scoring.device_map``,
        so Lightning gets one device ("auto" becomes 1; more devices or nodes are refused)."""
        devices = self.devices
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if one_process:
            if devices not in ("auto", 1) or self.num_nodes != 1:
                raise SettingsError(f"--scoring.device_map spreads one LM over this machine's devices from one process; "
                                    f"it cannot run with --trainer.devices {self.devices} --trainer.num_nodes "
                                    f"{self.num_nodes}: use --trainer.devices 1 (or drop --scoring.device_map to run "
                                    "one copy of the LM per device)")
            devices = 1
        return {"accelerator": self.accelerator, "devices": devices, "num_nodes": self.num_nodes,
                "strategy": self.strategy}


@dataclass(frozen=True)
class EncoderInput:
    """What a reranker's encoder reads of a (prefix, passage) pair: one group wherever a reranker is built or
    used (``reranking.fit``'s ``--model.input``, ``eval.ppl``'s ``--ranker.input`` for cosine), and recorded
    in every export, so that evaluation reads what training read.

    Args:
        max_prefix_tokens: Encoder tokens kept from the END of the prefix (the text next to the targets); the
            rest of the prefix is cut from the left. Special tokens included for a bi-encoder.
        max_passage_tokens: Bi-encoder: encoder tokens kept from the START of the passage ("title\\ntext").
        max_length: Cross-encoder: tokens per (prefix, passage) pair, special tokens included (RoBERTa: at
            most 512); the passage gets what the prefix leaves.
        drop: Strings removed from every prefix and passage before the encoder reads them (the LM still reads
            the passage as stored), e.g. ["<unk>"] for a training text that has them and evaluated text that
            does not.
    """

    max_prefix_tokens: int = 256
    max_passage_tokens: int = 256
    max_length: int = 512
    drop: list[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop", list(self.drop or []))
        p = [f"--input.{n} must be >= 1 (got {getattr(self, n)})" for n in ("max_prefix_tokens", "max_passage_tokens",
                                                                             "max_length") if getattr(self, n) < 1]
        if not all(isinstance(t, str) and t for t in self.drop):
            p.append(f"--input.drop {self.drop!r} must hold non-empty strings")
        _fail(p, "input")


@dataclass(frozen=True)
class Ranker:
    """Settings of the rerankers that run a model of their own.

    Args:
        model: zero-shot: a separate causal LM that ranks (its tokenizer may differ; default: the evaluated
            LM). cosine: the sentence encoder (required), e.g. minilm-l6.
        input: cosine: what the encoder reads of prefix and passage (to compare with a bi-encoder trained
            from the same encoder, give its --model.input; a trained reranker reads what its export records).
        batch_size: (prefix, passage) pairs per forward of a predictive or cosine reranker.
    """

    model: str | None = None
    input: EncoderInput = EncoderInput()
    batch_size: int = 64

    def __post_init__(self) -> None:
        _fail(_positive(self, "ranker", ("batch_size",)), "ranker")


def as_dict(obj) -> dict:
    """A settings object (or nested ones) as plain data for JSON files."""
    return dataclasses.asdict(obj)
