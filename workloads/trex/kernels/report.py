"""Markdown report (with a matplotlib plot) from an output directory's results.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def geomean(xs: list[float]) -> float | None:
    """Geometric mean (None when empty)."""
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Speedup bars (vs eager, vs torch.compile) and predicted-vs-measured scatter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [f"{r['kernel']}/{r['dtype']}" for r in results]
    xs = range(len(results))
    ax1.bar([x - 0.2 for x in xs], [r["speedup_eager"] for r in results], 0.4, label="vs eager")
    ax1.bar([x + 0.2 for x in xs], [r["speedup_compile"] or 0 for r in results], 0.4, label="vs torch.compile")
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
    ax1.set_ylabel("speedup")
    ax1.set_yscale("log")
    ax1.legend()
    for r in results:
        pts = r.get("predicted_vs_measured") or []
        if pts:
            ax2.scatter([p[0] * 1e3 for p in pts], [p[1] * 1e3 for p in pts], s=8, label=r["kernel"])
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("predicted (ms)")
    ax2.set_ylabel("measured (ms)")
    ax2.set_title("cost model vs measurement")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: str | Path) -> Path:
    """Write <out>/report.md and <out>/report.png; returns the Markdown path."""
    out = Path(out_dir)
    path = out / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `trex kernels tune --out {out}` first")
    data = json.loads(path.read_text(encoding="utf-8"))
    results: list[dict[str, Any]] = data["results"]
    facts = data["facts"]
    lines = [
        "# AuraKernel tuning report", "",
        f"Device: {facts['name']} — peak {facts['peak_flops'] / 1e9:.1f} GFLOP/s, DRAM {facts['bandwidth'] / 1e9:.1f} GB/s "
        f"(measured; caches {', '.join(f'{k} {v >> 10} KiB' for k, v in facts['caches'].items())}).", "",
        "Timings are medians of interleaved samples; speedups carry 95 % bootstrap intervals in results.json. "
        "On a shared host they are noisy.", "",
        "| kernel | dtype | shape | regime | tuned ms | eager ms | compile ms | vs eager | vs compile | roofline | BW frac | trials | Spearman |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        rho = "-" if r.get("spearman") is None else f"{r['spearman']:.2f}"
        lines.append(f"| {r['kernel']} | {r['dtype']} | {shape} | {r['regime']} | {_fmt_ms(r['tuned_s'])} | "
                     f"{_fmt_ms(r['eager_s'])} | {_fmt_ms(r.get('compiled_s'))} | {_fmt_x(r['speedup_eager'])} | "
                     f"{_fmt_x(r.get('speedup_compile'))} | {r['roofline_fraction']:.2f} | {r['bandwidth_fraction']:.2f} | "
                     f"{r['trials']} | {rho} |")
    ge = geomean([r["speedup_eager"] for r in results])
    gc = geomean([r["speedup_compile"] for r in results if r.get("speedup_compile")])
    fast1 = sum(1 for r in results if r["speedup_eager"] > 1.0) / max(1, len(results))
    fast15 = sum(1 for r in results if r["speedup_eager"] > 1.5) / max(1, len(results))
    lines += ["", f"Geometric-mean speedup: {_fmt_x(ge)} over eager, {_fmt_x(gc)} over torch.compile; "
              f"fast_1 = {fast1:.2f}, fast_1.5 = {fast15:.2f} (every tuned variant passed the correctness gate).", ""]
    comp = [r for r in results if r.get("compile_time_s")]
    if comp:
        lines.append("torch.compile compile times (excluded from per-call time): " + ", ".join(
            f"{r['kernel']} {r['compile_time_s']:.1f} s" for r in comp) + ".")
        lines.append("")
    lines += ["## Best configurations", ""]
    for r in results:
        lines.append(f"- `{r['kernel']}` {r['dtype']} {r['bucket']}: `{json.dumps(r['params'], sort_keys=True)}` "
                     f"(source {r['source_hash']}; search x{r['search_speedup']:.2f} over the MILP start; "
                     f"stop: {r['stop_reason']}; skills used: {r['skills_used']})")
    lines += ["", "![speedups and cost model](report.png)", ""]
    if results:
        plot(results, out / "report.png")
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return md
