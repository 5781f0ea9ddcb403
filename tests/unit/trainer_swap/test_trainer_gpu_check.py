"""`python -m trex.trainer.gpu_check --swap`: without CUDA it says so (exit 2); the comparison it prints is
the same code on CPU, where both runs end with the same parameters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from trex.trainer.gpu_check import compare, main, run_pair
from trex.trainer.optim.swap import SwapStats


def test_without_cuda_it_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["--swap"]) == 2
    assert "no cuda device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])  # nothing to check


def test_compare_leaves_out_warmup_and_pools_the_transfers() -> None:
    off = [SimpleNamespace(seconds=s, swap=None) for s in (9.0, 1.0, 1.0, 1.2)]
    on = [SimpleNamespace(seconds=s, swap=SwapStats(copy_seconds=1.0, exposed_seconds=e, host_bytes=100,
                                                   buffer_bytes=10)) for s, e in ((9.0, 1.0), (1.1, 0.1), (1.1, 0.3), (2.0, 0.2))]
    got = compare(off, on)
    assert got["step_s_no_swap"] == 1.0 and got["step_s_swap"] == 1.1
    assert got["ratio"] == pytest.approx(1.1) and got["overlap"] == pytest.approx(0.8)
    assert got["exposed_s"] == pytest.approx(0.2) and got["device_bytes_saved"] == 90
    with pytest.raises(ValueError, match="no transfers"):
        compare(off, off)


def test_the_check_runs_on_cpu_and_agrees() -> None:
    torch.set_num_threads(1)
    result = run_pair("tiny", "cpu", 3, 256)  # one bucket per optimizer: the same batches as without swap
    assert result["param_diff"] == 0 and 0 <= result["overlap"] <= 1 and result["step_s_swap"] > 0
    assert result["device_bytes_saved"] == 0  # two buffers of one bucket per optimizer hold every state
