"""The report of bench/overload.py: targets, tables, plots and the docs/BENCHMARKS.md section."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.bench.report import ROOT, md_table, pyplot, replace_marked

DOCS = ROOT / "docs"
BENCHMARKS = DOCS / "BENCHMARKS.md"
SECTION = "overload"  # <!-- begin overload --> ... <!-- end overload --> in BENCHMARKS.md
PLOTS = {"sweep": DOCS / "overload.png", "multiturn": DOCS / "overload-multiturn.png"}
GOODPUT_SHARE = 0.9  # target: goodput at 3C (admission on) >= this x goodput at 1C


def _f(value: float, digits: int = 0) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _point(points: Sequence[dict[str, Any]], load: float, admission: bool) -> dict[str, Any] | None:
    """The sweep's point (not the extra gateway-defaults one) at `load` x C."""
    return next((p for p in points if p["load"] == load and p["admission"] == admission
                 and not p["gateway_defaults"]), None)


def _admission(p: dict[str, Any]) -> str:
    return "off" if not p["admission"] else "on (gateway defaults)" if p["gateway_defaults"] else "on"


def targets(result: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(target, passed, the numbers) for each target the run can judge."""
    out: list[tuple[str, bool, str]] = []
    points = result.get("sweep", {}).get("points", [])
    at3, at1 = _point(points, 3.0, True), _point(points, 1.0, True)
    if at3 and at1:
        p99 = at3["p99_ttft_ms"]
        out.append(("3C, admission on: p99 TTFT of admitted interactive requests <= 500 ms",
                    not math.isnan(p99) and p99 <= 500.0, f"{_f(p99)} ms"))
        ratio = at3["goodput_rps"] / at1["goodput_rps"] if at1["goodput_rps"] else math.nan
        out.append((f"3C, admission on: goodput >= {GOODPUT_SHARE:.0%} of goodput at 1C (admission on)",
                    ratio >= GOODPUT_SHARE, f"{at3['goodput_rps']:.2f} / {at1['goodput_rps']:.2f} req/s = {ratio:.0%}"))
    rows = result.get("multiturn", {}).get("rows", [])
    if len(rows) == 2:
        aware, rr = rows
        ratio = aware["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else math.inf
        out.append(("multi-turn: prefix-cache hit rate >= 2x round-robin's", ratio >= 2.0,
                    f"{aware['hit_rate']:.1%} vs {rr['hit_rate']:.1%} ({ratio:.2f}x)"))
        out.append(("multi-turn: lower p50 TTFT than round-robin", aware["p50_ttft_ms"] < rr["p50_ttft_ms"],
                    f"{_f(aware['p50_ttft_ms'])} vs {_f(rr['p50_ttft_ms'])} ms"))
    return out


def _cpu(row: dict[str, Any]) -> list[str]:
    return [_f(row["cpu_gateway"], 2), _f(row["cpu_loadgen"], 2), _f(row["cpu_emulators"], 2), _f(row["cpu_redis"], 2)]


CPU_HEADER = ["gateway cores", "load gen cores", "emulators cores", "Redis cores"]


def probes_table(probes: Sequence[dict[str, Any]]) -> str:
    rows = [[_f(p["rate"], 2), p["sent"], p["ok"], _f(p["p99_ttft_ms"]), _f(p["p99_tpot_ms"], 1),
             "pass" if p["passes"] else "fail"] for p in probes]
    return md_table(["rate req/s", "sent", "ok", "p99 TTFT ms", "p99 TPOT ms", "verdict"], rows)


def sweep_table(points: Sequence[dict[str, Any]]) -> str:
    rows = [[f"{p['load']:g}C", _f(p["rate"], 2), _admission(p), p["sent"],
             f"{p['shed_share']:.0%}", p["unfinished"] + p["other_failed"], _f(p["p50_ttft_ms"]), _f(p["p99_ttft_ms"]),
             _f(p["p50_tpot_ms"], 1), _f(p["p99_tpot_ms"], 1), _f(p["goodput_rps"], 2),
             _f(p["mean_limit"], 1) if p["admission"] else "—", _f(p["mean_waiting"], 1), _f(p["idle_s"]),
             *_cpu(p), _f(p["other_cores"], 2)] for p in points]
    header = ["load", "offered req/s", "admission", "sent", "shed", "unfinished/failed", "p50 TTFT ms",
              "p99 TTFT ms", "p50 TPOT ms", "p99 TPOT ms", "goodput req/s", "mean limit", "mean backend queue",
              "fleet idle s", *CPU_HEADER, "other work cores"]
    return md_table(header, rows)


def multiturn_table(rows: Sequence[dict[str, Any]]) -> str:
    body = [[r["strategy"], r["requests"], r["failed"], f"{r['hit_rate']:.1%}", _f(r["p50_ttft_ms"]),
             _f(r["p99_ttft_ms"]), _f(r["p50_ttft_later_turns_ms"]), *_cpu(r)] for r in rows]
    return md_table(["replica choice", "requests", "failed", "prefix-cache hit rate", "p50 TTFT ms",
                       "p99 TTFT ms", "p50 TTFT turns 2+ ms", *CPU_HEADER], body)


def verdicts(result: dict[str, Any]) -> str:
    return "\n".join(f"- **{'PASS' if ok else 'FAIL'}** {name}: {numbers}" for name, ok, numbers in targets(result))


def _shed_line(points: Sequence[dict[str, Any]]) -> str:
    parts = [f"{p['load']:g}C {_admission(p)}: {', '.join(f'{k} x{v}' for k, v in sorted(p['shed_reasons'].items()))}"
             for p in points if p["admission"] and p["shed_reasons"]]
    return "Shed, by status and reason (admission on): " + ("; ".join(parts) if parts else "none") + "."


def render(result: dict[str, Any]) -> tuple[str, str]:
    """(terminal text, markdown section body)."""
    m, parts = result["machine"], []
    head = (f"`{result['command']}` ({result['mode']} run, {result['elapsed_s']:.0f} s), {m['date']}, "
            f"{m['cpu_model']} x{m['nproc']}, Python {m['python']}, commit {m['git_commit']}"
            f"{' (gateway/ modified)' if m['gateway_dirty'] else ''}. {result['pinning']}. "
            f"Load average at start {result['load_start'][0]:.2f}, at end {result['load_end'][0]:.2f}.")
    parts.append(head)
    if tuned := result["admission_settings"]:
        parts.append("Admission-on runs use these `admission:` settings instead of the gateway's defaults: "
                     + ", ".join(f"`{k}: {v:g}`" for k, v in tuned.items()) + ". `initial_limit` = `max_limit` = "
                     "the fleet's batch slots (replicas x the profile's max_running) by default: above them a "
                     "request only waits in a backend's queue, where admission can neither order it nor hold its "
                     "deadline. The row `on (gateway defaults)` is the top load with the defaults.")
    if "sweep" in result:
        s = result["sweep"]
        w = s["workload"]
        parts.append(f"Workload: ShareGPT first turns (mean {w['mean_prompt_tokens']:.0f} prompt tokens, mean "
                     f"max_tokens {w['mean_max_tokens']:.0f}, ignore_eos), Poisson arrivals, "
                     f"{result['durations']['window_s']:g} s of arrivals per point then at most "
                     f"{result['durations']['drain_s']:g} s of drain (still running: cancelled, counted unfinished).")
        if s["capacity_probes"]:
            parts.append("Capacity search (2 replicas, admission off, no SLO in the policy):\n\n"
                         + probes_table(s["capacity_probes"]))
        parts.append(f"**C = {s['capacity_rps']:.2f} req/s.** Offered load, admission on vs off (latencies of "
                     "answered requests; goodput = requests meeting TTFT <= 500 ms and TPOT <= 50 ms / arrival "
                     "window; mean limit = the gateway's adaptive limit, mean backend queue = requests waiting "
                     "in the emulators, both sampled each second; fleet idle s = seconds of the arrival window in "
                     "which no backend ran anything; cores = CPU seconds per second of wall time):\n\n"
                     + sweep_table(s["points"]))
        parts.append(_shed_line(s["points"]))
    if "multiturn" in result:
        mt = result["multiturn"]
        parts.append(f"Multi-turn replay: {mt['conversations']} ShareGPT conversations ({mt['turns']} turns, "
                     f"each turn sent after the previous answer, conversations starting as a Poisson process of "
                     f"{mt['conv_rate']:g}/s), 4 replicas, admission off:\n\n" + multiturn_table(mt["rows"]))
    parts.append("Targets:\n\n" + verdicts(result))
    markdown = "\n\n".join(parts)
    return markdown, markdown


# --------------------------------------------------------------------------- plots and docs


def plot_sweep(sweep: dict[str, Any], path: Path) -> Path:
    """p99 TTFT and goodput against offered load, admission on vs off."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    at1 = _point(sweep["points"], 1.0, True)
    for name, style in (("on", "-o"), ("off", "--s"), ("on (gateway defaults)", "x")):
        pts = [p for p in sweep["points"] if _admission(p) == name]
        if pts:
            ax1.plot([p["load"] for p in pts], [p["p99_ttft_ms"] for p in pts], style, label=f"admission {name}")
            ax2.plot([p["load"] for p in pts], [p["goodput_rps"] for p in pts], style, label=f"admission {name}")
    ax1.axhline(500, color="grey", lw=0.8, ls=":", label="SLO 500 ms")
    ax1.set_yscale("log")
    ax1.set_ylabel("p99 TTFT of answered requests (ms)")
    if at1:
        ax2.axhline(GOODPUT_SHARE * at1["goodput_rps"], color="grey", lw=0.8, ls=":", label="90% of 1C (on)")
    ax2.set_ylabel("goodput (req/s)")
    for ax in (ax1, ax2):
        ax.set_xlabel(f"offered load (x C = {sweep['capacity_rps']:.2f} req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_multiturn(mt: dict[str, Any], path: Path) -> Path:
    """Prefix-cache hit rate and TTFT p50/p99 per replica-choice strategy."""
    plt = pyplot()
    rows = mt["rows"]
    names = [r["strategy"].split(" ")[0] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=80)
    ax1.bar(names, [100 * r["hit_rate"] for r in rows], color=["tab:blue", "tab:orange"])
    ax1.set_ylabel("backend prefix-cache hit rate (%)")
    x = range(len(rows))
    ax2.bar([i - 0.2 for i in x], [r["p50_ttft_ms"] for r in rows], 0.4, label="p50")
    ax2.bar([i + 0.2 for i in x], [r["p99_ttft_ms"] for r in rows], 0.4, label="p99")
    ax2.set_xticks(list(x), names)
    ax2.set_ylabel("TTFT (ms)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("multi-turn ShareGPT replay, 4 replicas", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_docs(result: dict[str, Any], markdown: str) -> list[Path]:
    """The PNGs and the BENCHMARKS.md section (generated: replaced on every full run)."""
    written = [plot_sweep(result["sweep"], PLOTS["sweep"]), plot_multiturn(result["multiturn"], PLOTS["multiturn"])]
    images = "\n\n".join(f"![{name}]({p.name})" for name, p in PLOTS.items())
    note = "<!-- generated by bench/overload.py: do not edit by hand, rerun it -->"
    replace_marked(BENCHMARKS, SECTION, f"{note}\n\n{markdown}\n\n{images}")
    return [*written, BENCHMARKS]
