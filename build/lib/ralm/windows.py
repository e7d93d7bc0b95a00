"""The strided sliding windows of METHOD §2 (the reference ``eval_lm.py`` loop, as data).

Every stage shares this: evaluation walks all windows, data generation builds one window per
sampled position. Keeping the index arithmetic in one place is what keeps them consistent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """One stride: the LM reads ``ids[begin:end]`` and is scored on its last ``trg_len`` tokens.

    ``index`` is the stride number (0 = the first window, scored whole with no retrieval);
    ``target_begin`` (== the previous window's ``end``) is where retrieval must stop looking.
    """

    index: int
    begin: int
    end: int
    trg_len: int

    @property
    def length(self) -> int:
        return self.end - self.begin

    @property
    def target_begin(self) -> int:
        return self.end - self.trg_len

    @property
    def n_scored(self) -> int:
        """Tokens that get a prediction: the first window's first token has none."""
        return self.trg_len - 1 if self.index == 0 else self.trg_len


def stride_windows(n_tokens: int, stride: int, max_length: int) -> list[Window]:
    """All windows of the reference loop: ``for begin in range(0, N, s)`` until ``end == N``."""
    if n_tokens < 2:
        raise ValueError(f"the text has {n_tokens} token(s); perplexity needs at least 2")
    if stride < 1 or max_length < 2:
        raise ValueError(f"need stride >= 1 and max_length >= 2, got stride={stride}, max_length={max_length}")
    if stride > max_length:
        raise ValueError(f"stride ({stride}) > max_length ({max_length}) would leave tokens unscored")
    windows: list[Window] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + max_length, n_tokens)
        windows.append(Window(len(windows), begin, end, end - prev_end))
        prev_end = end
        if end == n_tokens:
            break
    return windows


def window_ending_at(target_begin: int, stride: int, max_length: int) -> Window:
    """The full-length window whose last ``stride`` tokens start at ``target_begin`` (data generation)."""
    end = target_begin + stride
    begin = end - max_length
    if begin < 0:
        raise ValueError(f"position {target_begin} leaves no room for a {max_length}-token window")
    return Window(index=-1, begin=begin, end=end, trg_len=stride)
