"""``auto`` precision follows the hardware (ralm.precision), and every stage uses the one rule."""

import contextlib

import pytest
import torch

from ralm import precision
from ralm.scoring import autocast_for


def _expected_cpu() -> str:
    _, flags = precision.cpu_info()
    native = any(f in flags for f in precision.NATIVE_BF16_FLAGS)
    return "bfloat16" if native and torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


def test_auto_resolves_as_the_detection_says_on_this_machine():
    choice = precision.resolve("auto", "cpu")
    assert choice.dtype == _expected_cpu(), (choice, precision.cpu_description())
    assert choice.lightning == {"bfloat16": "bf16-mixed", "float32": "32-true"}[choice.dtype]
    print(f"\nthis machine: {precision.cpu_description()} -> auto = {choice.describe('auto')}")


def test_a_cpu_without_native_bf16_gets_float32(monkeypatch):
    """The AVX2-only case (the 13x slower bf16 autocast): flags without avx512_bf16/amx_bf16."""
    monkeypatch.setattr(precision, "cpu_info", lambda: ("AMD EPYC (test)", ("avx", "avx2", "fma")))
    precision.native_bf16.cache_clear()
    try:
        choice = precision.resolve("auto", "cpu")
        assert choice.dtype == "float32" and "avx512_bf16" in choice.reason
        assert precision.lightning_precision("auto", "cpu")[0] == "32-true"
        assert isinstance(autocast_for(torch.device("cpu"), "auto"), contextlib.nullcontext)
        assert precision.resolve("bfloat16", "cpu").dtype == "bfloat16"  # an explicit setting wins
    finally:
        precision.native_bf16.cache_clear()


def test_explicit_settings_pass_through_and_bad_ones_are_refused():
    assert precision.lightning_precision("32-true", "cpu") == ("32-true", None)
    assert precision.lightning_precision("bf16-mixed", "cpu") == ("bf16-mixed", None)
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.resolve("fp8", "cpu")


def test_scoring_autocast_follows_auto():
    ctx = autocast_for(torch.device("cpu"), "auto")
    if _expected_cpu() == "float32":
        assert isinstance(ctx, contextlib.nullcontext)
    else:
        assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16


def test_fit_refuses_an_unknown_precision(capsys, tmp_path):
    from reranking.fit import main

    assert main(["--trainer.precision", "fp8", "--trainer.max_steps", "2", "--data.data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--trainer.precision 'fp8' is not a precision: use auto" in err and "bf16-mixed" in err
