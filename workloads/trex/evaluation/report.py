"""Reports of a run: Markdown and HTML with plots (Pass@1 per benchmark, failure breakdown, comparison
with an earlier run), rebuilt from ``samples.jsonl`` + ``run.json`` so ``trex eval report`` needs
nothing else."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from trex.evaluation.runner import (
    RUN,
    SAMPLES,
    SUMMARY,
    build_summary,
    read_samples,
    sample_key,
    write_json_atomic,
)
from trex.fsio import atomic_write_bytes
from trex.verify.scoring import CATEGORIES


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """Recompute a run's summary from its samples and run.json (ValueError when it is not a run dir)."""
    d = Path(run_dir)
    if not (d / RUN).is_file():
        raise ValueError(f"{str(run_dir)!r} is not an evaluation output directory (no {RUN})")
    meta = json.loads((d / RUN).read_text(encoding="utf-8"))
    records = read_samples(d / SAMPLES)
    # Keep the latest record per key (a changed prompt or protocol makes new keys, not duplicates).
    latest = {sample_key(r): r for r in records}
    summary = build_summary(meta, list(latest.values()))
    prev = d / SUMMARY
    if prev.is_file():
        summary["run"] = json.loads(prev.read_text(encoding="utf-8")).get("run", {})
    return summary


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _plot_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def make_plots(summary: dict[str, Any], against: dict[str, Any] | None) -> dict[str, bytes]:
    """PNG bytes of each plot (matplotlib Agg; comparison only with ``against``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = list(summary["benchmarks"])
    out: dict[str, bytes] = {}
    p1 = [summary["benchmarks"][b].get("pass@1") or 0.0 for b in benches]
    ci = [summary["benchmarks"][b].get("pass@1_ci95") or [v, v] for b, v in zip(benches, p1, strict=True)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(benches) + 2), 3.2))
    yerr = [[max(0.0, 100 * (v - c[0])) for v, c in zip(p1, ci, strict=True)],
            [max(0.0, 100 * (c[1] - v)) for v, c in zip(p1, ci, strict=True)]]
    ax.bar(benches, [100 * v for v in p1], yerr=yerr, capsize=3, color="#3b7dd8")
    ax.set_ylabel("Pass@1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Pass@1 per benchmark — {summary.get('model')}")
    ax.tick_params(axis="x", rotation=30)
    out["pass_at_1.png"] = _plot_png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, max(2.0, 0.5 * len(benches) + 1.2)))
    colours = plt.get_cmap("tab10")
    left = [0.0] * len(benches)
    for ci_, cat in enumerate(CATEGORIES):
        vals = []
        for b in benches:
            s = summary["benchmarks"][b]
            vals.append(100 * s["categories"].get(cat, 0) / s["samples"] if s["samples"] else 0.0)
        ax.barh(benches, vals, left=left, label=cat, color=colours(ci_ % 10))
        left = [a + v for a, v in zip(left, vals, strict=True)]
    ax.set_xlabel("samples (%)")
    ax.set_xlim(0, 100)
    ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.set_title("Outcome of every sample")
    out["failures.png"] = _plot_png(fig)
    plt.close(fig)

    if against is not None:
        common = [b for b in benches if b in against["benchmarks"]]
        fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(common) + 2), 3.2))
        xs = range(len(common))
        now = [100 * (summary["benchmarks"][b].get("pass@1") or 0) for b in common]
        then = [100 * (against["benchmarks"][b].get("pass@1") or 0) for b in common]
        ax.bar([x - 0.2 for x in xs], then, width=0.4, label=f"earlier: {against.get('model')}", color="#aaaaaa")
        ax.bar([x + 0.2 for x in xs], now, width=0.4, label=f"this run: {summary.get('model')}", color="#3b7dd8")
        ax.set_xticks(list(xs), common, rotation=30)
        ax.set_ylabel("Pass@1 (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        ax.set_title("Comparison with an earlier run")
        out["comparison.png"] = _plot_png(fig)
        plt.close(fig)
    return out


def _rows(summary: dict[str, Any], against: dict[str, Any] | None) -> list[list[str]]:
    ks = summary.get("k") or [1]
    rows = []
    for name, s in summary["benchmarks"].items():
        row = [name, str(s.get("protocol", {}).get("tag", "")), str(s["items"]), str(s["samples"])]
        row += [_pct(s.get(f"pass@{k}")) for k in ks]
        lo, hi = s.get("pass@1_ci95", [None, None])
        row.append(f"{_pct(lo)}–{_pct(hi)}")
        row.append(_pct(s.get("structural_accuracy")))
        row.append(_pct(s.get("objective_accuracy_feasible")))
        if against is not None:
            prev = against["benchmarks"].get(name, {}).get("pass@1")
            now = s.get("pass@1")
            row.append("-" if prev is None or now is None else f"{100 * (now - prev):+.1f} pp")
        rows.append(row)
    return rows


def _header(summary: dict[str, Any], against: dict[str, Any] | None) -> list[str]:
    ks = summary.get("k") or [1]
    h = ["benchmark", "protocol", "items", "samples", *[f"pass@{k}" for k in ks], "pass@1 95% CI",
         "structural (ORGEval)", "objective (feasible)"]
    return [*h, "Δ pass@1"] if against is not None else h


def render_markdown(summary: dict[str, Any], against: dict[str, Any] | None = None) -> str:
    """The Markdown report (plots referenced as files next to it)."""
    lines = [f"# Evaluation report: {summary.get('model')}", "", _run_line(summary), ""]
    if not summary.get("complete"):
        lines += ["**Incomplete run**: some samples are missing (see errors.jsonl); rerun to finish.", ""]
    head = _header(summary, against)
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(summary, against)]
    lines += ["", "## Protocols", ""]
    for name, s in summary["benchmarks"].items():
        p = s.get("protocol", {})
        lines.append(f"- **{name}**: `{p.get('tag', '')}` — {p.get('rule', '')}")
    lines += ["", f"Answers scored: {summary.get('answers') or 'solver-recorded'}; sandbox isolation: "
              f"{summary.get('isolation') or 'unknown'}."]
    lines += ["", "## Failure breakdown (samples)", "", "| benchmark | " + " | ".join(CATEGORIES) + " |",
              "|---|" + "---|" * len(CATEGORIES)]
    for name, s in summary["benchmarks"].items():
        lines.append(f"| {name} | " + " | ".join(str(s['categories'].get(c, 0)) for c in CATEGORIES) + " |")
    lines += ["", "## Per category", ""]
    for name, s in summary["benchmarks"].items():
        cats = s.get("by_category", {})
        if len(cats) > 1:
            lines.append(f"### {name}")
            ks = summary.get("k") or [1]
            lines += ["", "| category | items | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                      "|---|---|" + "---|" * len(ks)]
            lines += [f"| {c} | {v['items']} | " + " | ".join(_pct(v.get(f"pass@{k}")) for k in ks) + " |"
                      for c, v in cats.items()]
            lines.append("")
    lines += ["## Datasets", "", "| name | version | items | sha256 |", "|---|---|---|---|"]
    lines += [f"| {d['name']} | {d['version']} | {d['items']} | `{d['content_hash'][:16]}…` |"
              for d in summary.get("datasets", [])]
    v = summary.get("versions", {})
    sets = sorted({str(s.get("protocol", {}).get("prompt_set")) for s in summary["benchmarks"].values()
                   if s.get("protocol", {}).get("prompt_set")})
    lines += ["", f"Prompt contract v{v.get('prompt')} (prompt set {', '.join(sets) or 'n/a'}), extraction "
              f"v{v.get('extract')}, ORGEval v{v.get('orgeval')}.", ""]
    lines += ["![Pass@1](pass_at_1.png)", "", "![Failures](failures.png)", ""]
    if against is not None:
        lines += ["![Comparison](comparison.png)", ""]
    return "\n".join(lines)


ITEM_TEXT_LIMIT = 20_000
"""Characters of one prompt, response or program shown in the HTML drill-down (the record keeps all)."""


def report_records(run_dir: str | Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples a report's drill-down shows: the latest record of each (benchmark, item, sample) under the
    benchmark's current protocol, in the order they were recorded."""
    tags = {b: s.get("protocol", {}).get("tag") for b, s in summary["benchmarks"].items()}
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in read_samples(Path(run_dir) / SAMPLES):
        if r.get("benchmark") in tags and r.get("protocol") == tags[r["benchmark"]]:
            latest[(r["benchmark"], str(r["item_id"]), int(r["sample_index"]))] = r
    return list(latest.values())


def _clip(text: Any) -> str:
    t = "" if text is None else str(text)
    return t if len(t) <= ITEM_TEXT_LIMIT else t[:ITEM_TEXT_LIMIT] + f"\n… ({len(t) - ITEM_TEXT_LIMIT} more characters)"


def _sandbox_output(rec: dict[str, Any]) -> str:
    ex = rec.get("execution")
    if not ex:
        return "not run (" + ("syntax error: " + str(rec["syntax_error"]) if rec.get("syntax_error")
                              else "no program extracted") + ")"
    head = f"exit code {ex.get('exit_code')}" + (" (timed out)" if ex.get("timed_out") else "") + \
        (f", killed: {ex['killed_reason']}" if ex.get("killed_reason") else "")
    return f"{head}\n--- stdout (tail) ---\n{ex.get('stdout_tail', '')}\n--- stderr (tail) ---\n{ex.get('stderr_tail', '')}"


def render_items(records: list[dict[str, Any]]) -> str:
    """The per-item drill-down: one collapsible entry per sample with prompt, response, extracted program,
    sandbox output and verdict (HTML)."""
    e = html.escape
    parts = []
    for r in records:
        ok = r.get("category") == "correct"
        title = (f"{e(str(r['benchmark']))} / {e(str(r['item_id']))} #{r['sample_index']}: "
                 f"<span class='{'ok' if ok else 'bad'}'>{e(str(r.get('category')))}</span>")
        verdict = f"{r.get('category')}: {r.get('reason') or ''}\npredicted: {json.dumps(r.get('prediction'))}\n" \
                  f"expected: {json.dumps(r.get('truth'))}"
        if r.get("structural") is not None:
            verdict += f"\nstructural (ORGEval): {r['structural']} {r.get('structural_reason') or ''}"
        sections = [("Prompt", r.get("prompt", "(not recorded by this version)")), ("Response", r.get("response")),
                    ("Extracted program", r.get("code") if r.get("code") is not None else "(none)"),
                    ("Sandbox output", _sandbox_output(r)), ("Verdict", verdict)]
        body = "".join(f"<h4>{name}</h4><pre>{e(_clip(text))}</pre>" for name, text in sections)
        parts.append(f"<details><summary>{title}</summary>{body}</details>")
    return "".join(parts)


def render_html(summary: dict[str, Any], plots: dict[str, bytes], against: dict[str, Any] | None = None,
                records: list[dict[str, Any]] | None = None) -> str:
    """A self-contained HTML report (plots embedded as PNG data URIs; ``records``: the per-item drill-down)."""
    e = html.escape
    head = _header(summary, against)
    table = "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in _rows(summary, against)) + "</table>"
    fail = "<table><tr><th>benchmark</th>" + "".join(f"<th>{e(c)}</th>" for c in CATEGORIES) + "</tr>" + "".join(
        f"<tr><td>{e(n)}</td>" + "".join(f"<td>{s['categories'].get(c, 0)}</td>" for c in CATEGORIES) + "</tr>"
        for n, s in summary["benchmarks"].items()) + "</table>"
    protos = "<ul>" + "".join(
        f"<li><b>{e(n)}</b>: <code>{e(str(s.get('protocol', {}).get('tag', '')))}</code> — "
        f"{e(str(s.get('protocol', {}).get('rule', '')))}</li>" for n, s in summary["benchmarks"].items()) + "</ul>"
    ds = "<ul>" + "".join(f"<li>{e(d['name'])}: {e(d['version'])}, {d['items']} items</li>"
                          for d in summary.get("datasets", [])) + "</ul>"
    imgs = "".join(f'<p><img alt="{e(k)}" src="data:image/png;base64,{base64.b64encode(v).decode()}"></p>'
                   for k, v in plots.items())
    warn = "" if summary.get("complete") else "<p><b>Incomplete run</b>: some samples are missing.</p>"
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "pre{background:#f6f6f6;padding:6px;white-space:pre-wrap}.ok{color:#17752f}.bad{color:#b3261e}")
    about = f"<p>{e(_run_line(summary))}</p>"
    items = f"<h2>Samples</h2>{render_items(records)}" if records else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Evaluation: {e(str(summary.get('model')))}"
            f"</title><style>{style}</style></head><body><h1>Evaluation report: {e(str(summary.get('model')))}</h1>"
            f"{about}{warn}{table}<h2>Protocols</h2>{protos}<h2>Failure breakdown</h2>{fail}<h2>Datasets</h2>{ds}"
            f"{imgs}{items}</body></html>")


def _run_line(summary: dict[str, Any]) -> str:
    """Run date and endpoint, as the reports head them."""
    return f"Run started {summary.get('started') or 'unknown'}; endpoint: {summary.get('endpoint') or 'unknown'}."


def write_reports(run_dir: str | Path, summary: dict[str, Any], against: dict[str, Any] | None = None) -> list[Path]:
    """Write summary.json, report.md, report.html and the plots into ``run_dir``; returns the paths."""
    d = Path(run_dir)
    plots = make_plots(summary, against) if summary["benchmarks"] else {}
    written = []
    for name, data in plots.items():
        atomic_write_bytes(d / name, data)
        written.append(d / name)
    write_json_atomic(d / SUMMARY, summary)
    atomic_write_bytes(d / "report.md", render_markdown(summary, against).encode())
    html_text = render_html(summary, plots, against, report_records(d, summary))
    atomic_write_bytes(d / "report.html", html_text.encode())
    return [*written, d / SUMMARY, d / "report.md", d / "report.html"]
