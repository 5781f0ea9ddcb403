"""`trex mfu` command: a table on valid input, exit 2 with a message naming the option otherwise."""

from __future__ import annotations

import pytest
from trex.trainer.mfu import flops_per_token, mfu, param_breakdown
from trex.trainer.mfu_cli import main
from trex.trainer.presets import resolve_model_values


def test_mfu_cli_prints_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--preset", "v4-pro", "--device", "910c", "--tokens-per-second-per-device", "300",
               "--seq-len", "4096"])
    out = capsys.readouterr().out
    assert rc == 0
    v = resolve_model_values("v4-pro", {})
    expected = 100 * mfu(300, flops_per_token(v, 4096), 376e12)
    assert f"{expected:.2f} %" in out
    total = param_breakdown(v).total
    assert f"{total / 1e12:.3f} T" in out
    for word in ("active parameters", "FLOPs per token"):
        assert word in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["--device", "910x", "--tokens-per-second-per-device", "1"], "unknown device"),
    (["--device", "h100", "--tokens-per-second-per-device", "-5"], "--tokens-per-second-per-device"),
    (["--device", "h100", "--tokens-per-second-per-device", "5", "--seq-len", "0"], "--seq-len"),
])
def test_mfu_cli_bad_input_exits_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "tiny", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_mfu_cli_unknown_preset_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "v9", "--device", "h100", "--tokens-per-second-per-device", "1"])
    assert exc.value.code == 2
