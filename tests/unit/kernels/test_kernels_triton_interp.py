"""The cuda-triton kernels pass the correctness gate under TRITON_INTERPRET=1 on CPU tensors (the
interpreter flag must be set before triton is imported, hence a fresh interpreter process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os
    assert os.environ["TRITON_INTERPRET"] == "1"
    from trex.kernels.backends.triton import TRITON_KERNELS, TritonBackend
    from trex.kernels.suite import get
    from trex.kernels.verify import verify

    SMALL = {
        "rmsnorm_fwd": [{"rows": 3, "cols": 129}, {"rows": 2, "cols": 1000}, {"rows": 1, "cols": 8}],
        "swiglu_clamp_fwd": [{"rows": 3, "cols": 131}, {"rows": 5, "cols": 1000}, {"rows": 1, "cols": 1}],
        "swiglu_clamp_bwd": [{"rows": 3, "cols": 131}, {"rows": 5, "cols": 1000}, {"rows": 1, "cols": 1}],
        "rope_fwd": [{"tokens": 3, "heads": 2, "dim": 34}, {"tokens": 2, "heads": 3, "dim": 130}, {"tokens": 1, "heads": 1, "dim": 2}],
        "rope_inv": [{"tokens": 3, "heads": 2, "dim": 34}, {"tokens": 2, "heads": 3, "dim": 130}, {"tokens": 1, "heads": 1, "dim": 2}],
        "cross_entropy": [{"rows": 3, "vocab": 1001}, {"rows": 1, "vocab": 7}, {"rows": 2, "vocab": 300}],
        "kl_div": [{"rows": 3, "vocab": 1001}, {"rows": 1, "vocab": 7}, {"rows": 2, "vocab": 300}],
        # k = 1 and k > 1, both scores, experts not a power of two; a BLOCK smaller than the tokens
        "router_topk": [{"tokens": 5, "experts": 9, "k": 1, "score": 2}, {"tokens": 33, "experts": 17, "k": 3, "score": 1},
                        {"tokens": 7, "experts": 64, "k": 6, "score": 2}],
        # an idle expert, experts with more rows than MB (the row loop turns), odd hidden/out
        "grouped_gemm": [{"tokens": 37, "experts": 5, "hidden": 33, "out": 19}, {"tokens": 9, "experts": 3, "hidden": 7, "out": 65},
                         {"tokens": 40, "experts": 2, "hidden": 20, "out": 24}],
        # features not a multiple of BLOCK, n*n not a power of two, one Sinkhorn iteration
        "mhc_pre": [{"tokens": 3, "streams": 4, "hidden": 33, "iters": 20}, {"tokens": 2, "streams": 3, "hidden": 65, "iters": 5},
                    {"tokens": 1, "streams": 2, "hidden": 8, "iters": 1}],
    }
    PARAMS = {"router_topk": {"BLOCK": 4, "WARPS": 4}, "mhc_pre": {"BLOCK": 32, "WARPS": 4, "STAGES": 2},
              "grouped_gemm": {"MB": 16, "NB": 16, "KB": 16, "WARPS": 4, "STAGES": 2}}
    be = TritonBackend()
    assert be.device() == "cpu"
    out = {}
    for name in TRITON_KERNELS:
        spec = get(name)
        for dtype in spec.dtypes:
            comp = be.compile(spec, PARAMS.get(name, {"BLOCK": 256, "WARPS": 4, "STAGES": 2}), dtype)
            v = verify(spec, comp, dtype, seeds=5, shapes=SMALL[name], full_shapes_seeds=5)
            out[f"{name}/{dtype}"] = [v.ok, v.reason, v.checks]
    print("RESULT " + json.dumps(out))
''')


@pytest.mark.slow
def test_triton_kernels_pass_correctness_in_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert {k.split("/")[0] for k in res} >= {"router_topk", "grouped_gemm", "mhc_pre", "rmsnorm_fwd"}
    bad = {k: v[1] for k, v in res.items() if not v[0]}
    assert not bad, bad
    assert all(v[2] == 15 for v in res.values()) and len(res) == 17  # 7 kernels in fp32 and bf16, 3 in fp32


def test_triton_backend_without_cuda_or_interpreter_is_unavailable() -> None:
    code = textwrap.dedent('''
        import os
        os.environ.pop("TRITON_INTERPRET", None)
        import torch
        from trex.kernels.backends.base import BackendUnavailable
        from trex.kernels.backends.triton import TritonBackend
        from trex.kernels.suite import get
        if torch.cuda.is_available():
            print("HAS_CUDA")
        else:
            try:
                TritonBackend().compile(get("rmsnorm_fwd"), {"BLOCK": 256, "WARPS": 4, "STAGES": 2}, "fp32")
            except BackendUnavailable as e:
                print("UNAVAILABLE", e)
    ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if "HAS_CUDA" not in proc.stdout:
        assert "UNAVAILABLE" in proc.stdout and "CUDA" in proc.stdout
