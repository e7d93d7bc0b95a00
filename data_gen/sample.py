"""Stage "sample": tokenize the training text once and draw example positions from a seed.

The whole text is tokenized with the LM tokenizer (no special tokens). To stay fast and light on
memory for WikiText-103 (~540 MB), it is cut *before every level-1 heading line* (`` = Title = ``)
and the pieces are tokenized in batches. For byte-level BPE tokenizers (GPT-2 and the like) this
gives exactly the tokens of the whole string: the cut sits between the ``\\n`` that ends a line and
the `` =`` that opens the heading, which is a pre-tokenizer boundary (tested in
``tests/test_data_gen.py``). The pieces are the articles, so each token's source article title
comes for free.

An example is a target position ``p`` with ``L - s <= p <= N - s``; its window is
``ralm.windows.window_ending_at(p, s, L)`` (always full length), its targets the window's last s tokens.
With m targets per window (``--targets.per_window``) the window ends after the last of m consecutive targets
and each target's prefix is the window's part before it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from data_gen.shards import atomic_save_npy, atomic_write_parquet, store_config
from ralm.articles import split_articles

from .config import BuildConfig, BuildError, load_text, log

if TYPE_CHECKING:
    from .shards import Layout


@dataclass
class TokenizedText:
    ids: np.ndarray  # (N,) int32
    article_starts: np.ndarray  # (A,) int64, token index where article a begins
    titles: list[str]  # (A,)

    def title_at(self, positions: np.ndarray) -> list[str]:
        idx = np.searchsorted(self.article_starts, positions, side="right") - 1
        return [self.titles[i] for i in idx]


def tokenize_text(tokenizer, text: str, batch: int = 256, progress: bool = True) -> TokenizedText:
    """Token ids of ``text`` (no special tokens) with the article each token belongs to."""
    pieces, titles = split_articles(text)
    if len(pieces) > 1 and not _split_is_exact(tokenizer, pieces):
        return _tokenize_whole(tokenizer, pieces, titles)
    chunks: list[np.ndarray] = []
    for i in tqdm(range(0, len(pieces), batch), desc="tokenize articles", unit="batch", disable=not progress):
        enc = tokenizer(pieces[i:i + batch], add_special_tokens=False)["input_ids"]
        chunks.extend(np.asarray(e, dtype=np.int32) for e in enc)
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    keep = lengths > 0
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    return TokenizedText(ids=ids, article_starts=starts[keep], titles=[t for t, k in zip(titles, keep) if k])


def _tokenize_whole(tokenizer, pieces: list[str], titles: list[str]) -> TokenizedText:
    """Fallback for tokenizers that merge across the cut: one call on the whole text, articles by offsets."""
    text = "".join(pieces)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tok_chars = np.array([o[0] for o in enc["offset_mapping"]], dtype=np.int64)
    piece_chars = np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).astype(np.int64)
    starts = np.searchsorted(tok_chars, piece_chars, side="left")
    first = np.r_[True, starts[1:] != starts[:-1]] & (starts < len(tok_chars))
    starts[0] = 0
    return TokenizedText(ids=np.asarray(enc["input_ids"], dtype=np.int32), article_starts=starts[first],
                         titles=[t for t, k in zip(titles, first) if k])


def _split_is_exact(tokenizer, pieces: list[str], checks: int = 8) -> bool:
    """Do the first cuts leave tokens unchanged (tokens(a + b) == tokens(a) + tokens(b))?"""
    for a, b in list(zip(pieces, pieces[1:]))[:checks]:
        a, b = a[-2000:], b[:2000]
        enc = tokenizer([a + b, a, b], add_special_tokens=False)["input_ids"]
        if enc[0] != enc[1] + enc[2]:
            return False
    return True


def sample_positions(n_tokens: int, examples: int, window: int, stride: int, seed: int,
                     per_window: int = 1) -> np.ndarray:
    """``examples`` target positions (int64), ``per_window`` consecutive ones per window.

    The windows' last targets are distinct positions p in ``[window - stride, n_tokens - stride]``, drawn without
    replacement by ``numpy.random.default_rng(seed)`` in the example order; window w's targets (examples
    w*m .. w*m+m-1) begin at p - (m-1)*s, ..., p - s, p, so they share the window ending at p + s.
    """
    n_windows = examples // per_window
    lo, hi = window - stride, n_tokens - stride
    n_valid = hi - lo + 1
    if n_valid < 1:
        raise BuildError(
            f"the training text has {n_tokens:,} tokens, fewer than one {window}-token window; "
            "use a longer text (--text.file / --text.dataset) or a smaller --windows.max_length")
    if n_windows > n_valid:
        raise BuildError(
            f"--examples {examples:,}{f' ({n_windows:,} windows of {per_window})' if per_window > 1 else ''} exceeds "
            f"the {n_valid:,} distinct positions of the training text ({n_tokens:,} tokens, window {window}); lower "
            "--examples or use a longer text")
    rng = np.random.default_rng(seed)
    last = rng.choice(n_valid, size=n_windows, replace=False).astype(np.int64) + lo
    if per_window == 1:
        return last
    back = (np.arange(per_window, dtype=np.int64)[::-1] * stride)  # (m-1)*s, ..., s, 0
    return (last[:, None] - back[None, :]).reshape(-1)


def run_sample(layout: Layout, build: BuildConfig, tokenizer, window: int, write: bool):
    """Token ids of the training text and the sampled example positions (cached in work/)."""
    if layout.tokens.exists() and layout.samples.exists():
        return np.load(layout.tokens, mmap_mode="r"), pq.read_table(layout.samples)
    if not write:
        raise BuildError(f"{layout.samples} is missing on a non-zero rank: run `--stage retrieve` once (single "
                         "process) before a multi-node scoring run")
    text = load_text(build.text, "text")
    t0 = time.perf_counter()
    tok = tokenize_text(tokenizer, text)
    log(f"[sample] {build.text.describe()}: {len(text):,} chars -> {len(tok.ids):,} tokens, {len(tok.titles):,} "
         f"articles in {time.perf_counter() - t0:.1f}s")
    positions = sample_positions(len(tok.ids), build.examples, window, build.windows.stride, build.seed,
                                 build.targets.per_window)
    samples = pa.table({"id": np.arange(build.examples, dtype=np.int64), "position": positions,
                        "source_title": tok.title_at(positions)})
    store_config(layout)  # every input passed: from here on the directory holds this dataset
    atomic_save_npy(layout.tokens, tok.ids)
    atomic_write_parquet(layout.samples, samples)
    return np.load(layout.tokens, mmap_mode="r"), samples
