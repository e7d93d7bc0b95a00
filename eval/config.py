"""Settings of ``python -m eval.ppl``, grouped and self-checking."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class PplConfig:
    model: str = "gpt2"
    """Causal LM to evaluate: hub name or local directory."""
    reranker: str = "bm25"
    """none | bm25 | random | zero-shot | oracle | path to a trained reranker (export dir or .ckpt)."""
    dataset: str = "wikitext"
    """Hugging Face dataset of the evaluation text (ignored with text_file)."""
    dataset_config: str | None = "wikitext-103-v1"
    """Its configuration name (wikitext-103-v1 is the <unk> version the paper's numbers use)."""
    split: str = "test"
    """Its split."""
    text_file: str | None = None
    """A local evaluation text file, read as is (overrides dataset)."""
    index: str | None = None
    """BM25 index: Pyserini prebuilt name (wikipedia-dpr-100w) or a local Lucene index directory."""
    retrieval_file: str | None = None
    """Retrieval results in the reference implementation's JSON format (instead of --index)."""
    save_retrieval_file: str | None = None
    """Also write the retrieval used to this reference-format JSON file."""
    k1: float = 0.9
    """BM25 k1 (Pyserini's default)."""
    b: float = 0.4
    """BM25 b (Pyserini's default)."""
    forbidden_titles: bool = True
    """Skip passages whose title is an article heading of the evaluation text (DESIGN §4)."""
    stride: int = 4
    """s: retrieve every s tokens."""
    query_tokens: int = 32
    """ℓ: the BM25 query is the last ℓ LM tokens before the stride."""
    k: int = 16
    """Candidates per stride."""
    max_length: int = 1024
    """L: LM window (clipped to the model's context)."""
    doc_max_tokens: int = 256
    """Document budget in LM tokens."""
    zero_shot_model: str | None = None
    """Separate LM for zero-shot ranking (vocabulary may differ); default: the evaluated LM."""
    zero_shot_tokens: int = 16
    """s': zero-shot ranks on the NLL of this many prefix tokens."""
    seed: int = 0
    """Seed of the random reranker."""
    batch_size: int = 16
    """Rows ([document ; window]) per LM forward."""
    reranker_batch_size: int = 64
    """(prefix, passage) pairs per reranker forward."""
    strides_per_chunk: int = 64
    """Strides gathered (retrieved, reranked, scored) together."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    dtype: str = "auto"
    """auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16 | float16."""
    output_dir: str = "runs/ppl"
    """Where results.json, results.md, strides.parquet and tokens.npz go."""
    cache_dir: str | None = None
    """Retrieval cache directory (default: <output_dir>/../retrieval_cache)."""

    def __post_init__(self):
        problems = []
        for name in ("stride", "query_tokens", "k", "max_length", "doc_max_tokens", "zero_shot_tokens",
                     "batch_size", "reranker_batch_size", "strides_per_chunk"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.stride > self.max_length:
            problems.append(f"--stride ({self.stride}) must not exceed --max-length ({self.max_length})")
        if self.reranker != "none" and not (self.index or self.retrieval_file):
            problems.append(f"--reranker {self.reranker} needs candidates: pass --index or --retrieval-file")
        if self.index and self.retrieval_file:
            problems.append("pass only one of --index and --retrieval-file")
        if self.retrieval_file and not Path(self.retrieval_file).is_file():
            problems.append(f"--retrieval-file {self.retrieval_file!r} does not exist")
        if self.text_file and not Path(self.text_file).is_file():
            problems.append(f"--text-file {self.text_file!r} does not exist")
        if problems:
            raise ValueError("invalid eval.ppl settings:\n  " + "\n  ".join(problems))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Field docstrings (the string literal after each field) for --help."""
        import ast
        import inspect

        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body
        docs = {}
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                docs[a.target.id] = b.value.value
        return docs

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
