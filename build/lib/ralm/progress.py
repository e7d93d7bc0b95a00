"""Progress of long stages: a bar with rate and ETA on a terminal, plain periodic log lines otherwise.

A job whose output goes to a file (a cluster log, ``nohup``) gets a line such as
``[score] 1,200/300,000 examples (0.4%) 8.1/s, elapsed 2m28s, ETA 10h15m`` every ``interval``
seconds instead of a carriage-return bar that never shows up.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def _dur(s: float) -> str:
    s = int(max(0, s))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """``with Progress(total, "score", "examples") as p: ... p.update(n)``; silent when ``enabled`` is False."""
    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True, interval: float = 30.0,
                 initial: int = 0):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.enabled = enabled
        self.n = initial
        self._initial = initial
        self._start = self._last = time.monotonic()
        self._bar = None
        self.extra = ""  # appended to each log line (e.g. the current loss)
        if enabled and sys.stderr.isatty():
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, smoothing=0.05)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and time.monotonic() - self._last >= self.interval:
            self._log()

    def _log(self) -> None:
        now = time.monotonic()
        self._last = now
        done = self.n - self._initial
        rate = done / max(now - self._start, 1e-9)
        left = (self.total - self.n) / rate if rate > 0 else float("inf")
        pct = 100.0 * self.n / self.total if self.total else 100.0
        eta = _dur(left) if left != float("inf") else "?"
        print(f"[{self.desc}] {self.n:,}/{self.total:,} {self.unit} ({pct:.1f}%) {rate:,.1f}/s, "
              f"elapsed {_dur(now - self._start)}, ETA {eta}{self.extra}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.n > self._initial:
            self._log()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
