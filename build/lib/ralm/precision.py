"""The compute precision of every stage, chosen by the hardware: bf16 only where it is native and fast.

One rule for the LM scoring of ``eval.ppl`` and ``data_gen.build`` (``--scoring.dtype``) and for the
fine-tuning of ``reranking.fit`` (``--trainer.precision``): ``auto`` becomes bf16 on a CUDA device that
supports it and on a CPU that runs bf16 natively (oneDNN reports bf16 support *and* the CPU has AVX-512
BF16 or AMX-BF16), float32 everywhere else. Why the CPU check is strict: on an AVX2-only CPU bf16
autocast falls back to slow kernels (one MiniLM training step 13x slower than float32), and oneDNN
alone also reports support on AVX-512 CPUs that only emulate bf16. An explicit setting always wins.
``python bench/bf16_speed.py`` measures the choice on the machine at hand.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

#: CPU flags (as /proc/cpuinfo spells them) of native bf16 arithmetic.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: CPU flags worth printing beside a timing.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16")

SCORING_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_TO_LIGHTNING = {"float32": "32-true", "bfloat16": "bf16-mixed"}


@dataclass(frozen=True)
class Choice:
    """A resolved precision and why it was chosen (printed once per run, recorded in its outputs)."""
    dtype: str          # float32 | bfloat16 | float16
    reason: str

    @property
    def lightning(self) -> str:
        """The Lightning ``Trainer(precision=...)`` spelling."""
        return _DTYPE_TO_LIGHTNING.get(self.dtype, "16-mixed")

    def describe(self, setting: str) -> str:
        return f"{self.dtype} ({'auto: ' if setting == 'auto' else 'set explicitly; '}{self.reason})"


@functools.lru_cache(maxsize=1)
def cpu_info() -> tuple[str, tuple[str, ...]]:
    """(model name, flags) of this machine's CPU; flags are empty where /proc/cpuinfo is not readable."""
    name, flags = "", ()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = tuple(value.split())
    name = name or platform.processor() or platform.machine()
    return name, flags


def cpu_description() -> str:
    """``'<model name>; flags: avx2 avx512f ...'``: what every timing is reported with."""
    name, flags = cpu_info()
    shown = [f for f in REPORTED_FLAGS if f in flags]
    return f"{name}; flags: {' '.join(shown) if shown else 'none of ' + ' '.join(REPORTED_FLAGS)}"


def _onednn_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=None)
def native_bf16(device_type: str) -> tuple[bool, str]:
    """Whether ``device_type`` ("cuda" or "cpu") runs bf16 natively, and the evidence."""
    if device_type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return ok, f"CUDA {name} {'supports' if ok else 'does not support'} bf16"
    if device_type != "cpu":
        return False, f"{device_type}: bf16 is not assumed native"
    name, flags = cpu_info()
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    onednn = _onednn_bf16()
    if native and onednn:
        return True, f"CPU {name} has {'/'.join(native)} and oneDNN reports bf16 support"
    why = "no " + "/".join(NATIVE_BF16_FLAGS) if not native else "oneDNN reports no bf16 support"
    return False, f"CPU {name}: {why}, so bf16 would run on slow kernels"


def resolve(setting: str, device_type: str) -> Choice:
    """The compute dtype for ``setting`` (auto | float32 | bfloat16 | float16) on ``device_type``."""
    if setting not in SCORING_DTYPES:
        raise ValueError(f"precision must be one of {', '.join(SCORING_DTYPES)}; got {setting!r}")
    ok, why = native_bf16(device_type)
    if setting == "auto":
        return Choice("bfloat16" if ok else "float32", why)
    return Choice(setting, why)


#: Lightning precision spellings that mean "the hardware decides".
AUTO_PRECISION = ("auto", None)


def run_device_type(accelerator: str | None) -> str:
    """The device type a run with Lightning's ``accelerator`` setting computes on ("cuda" or "cpu")."""
    acc = (accelerator or "auto").lower()
    return "cuda" if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()) else "cpu"


def for_run(setting: str, accelerator: str | None) -> Choice:
    """:func:`resolve` for the device a run with Lightning's ``accelerator`` setting computes on."""
    return resolve(setting, run_device_type(accelerator))


def lightning_precision(setting, accelerator: str | None) -> tuple[object, str | None]:
    """``Trainer(precision=...)`` for ``setting``: ``auto`` resolved for the accelerator the run will use
    (with a line saying why), anything else passed through unchanged (``None`` for the line)."""
    if setting not in AUTO_PRECISION:
        return setting, None
    choice = for_run("auto", accelerator)
    return choice.lightning, f"precision {choice.lightning}: {choice.describe('auto')}"
