"""`gateway route explain` for people: the report of gateway.routing.explain as `key: value` lines, one fact a line,
values in words and numbers (no JSON); `--json` prints the report itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

WIDTH = 16  # keys are right-aligned to this width


def lines(report: Mapping[str, Any]) -> list[str]:
    out = [_line("tenant", report["tenant"]), _line("config version", report["config_version"])]
    if (limits := report.get("limits")) is not None:
        out += _limits(limits)
    if "difficulty" in report:
        out.append(_line("difficulty", _none(report["difficulty"], "not scored")))
    bands = report.get("bands") or ()
    out += [_line("band", _band(band, i == len(bands) - 1)) for i, band in enumerate(bands)]
    if (quality := report.get("quality")) is not None:
        out += _quality(quality)
    if report.get("route_reason"):
        out.append(_line("why this tier", report["route_reason"]))
    if "tier" in report:
        out.append(_line("tier", report["tier"]))
    if report.get("rerouted_from"):
        out.append(_line("rerouted from", f"{report['rerouted_from']} (no replica of it may be tried now)"))
    if (spill := report.get("spill")) is not None:
        out.append(_line("spill", _spill(spill)))
    if (session := report.get("session")) is not None:
        out.append(_line("session", f"{_none(session['holds'], 'no tier yet')}: {session['effect']}"))
    out += [_line(f"candidate {i + 1}", _candidate(c)) for i, c in enumerate(report.get("candidates") or ())]
    if (cache := report.get("cache")) is not None:
        out += _cache(cache)
    out.append(_line("decision", _decision(report["decision"])))
    return out


def _spill(spill: Mapping[str, Any]) -> str:
    """What spill would do at the current load, and the predictions it compares."""
    chosen, to = spill["from"], spill["to"]
    if to is None:
        return f"would keep {chosen['tier']} (SLO {spill['slo_ms']:g} ms): {spill['reason']}"
    loss = spill["quality_loss"]
    given = "" if loss is None else f", quality given up {loss:.4f}"
    return (f"would spill {chosen['tier']} -> {to['tier']}: predicted {chosen['ttft_ms']} ms > SLO {spill['slo_ms']:g} "
            f"ms, {to['tier']} {to['ttft_ms']} ms{given}")


def _line(key: str, value: object) -> str:
    return f"{key:>{WIDTH}}: {value}"


def _none(value: object, absent: str = "none") -> str:
    return absent if value is None else str(value)


def _limits(limits: Mapping[str, Any]) -> list[str]:
    mt = limits["max_tokens"]
    rate = limits["rate_limit"] or {}
    rates = [f"{rate[k]} {unit}" for k, unit in (("requests_per_min", "requests/min"), ("tokens_per_min", "tokens/min"))
             if rate.get(k) is not None]
    cap = limits["output_cap"] or {}
    caps = [f"{cap[k]} {k}" for k in ("tokens", "chars") if cap.get(k) is not None]
    allowed = limits["allowed_tiers"]
    return [
        _line("max_tokens", f"asked {_none(mt['asked'], 'nothing')}, applied {mt['applied']} (default {mt['default']}, "
                            f"maximum {mt['maximum']}, above it: {mt['on_exceed']})"),
        _line("prompt chars", f"{limits['prompt_chars']} (at most {_none(limits['max_prompt_chars'], 'unlimited')})"),
        _line("prompt tokens", f"~{limits['prompt_tokens_est']} (at most "
                               f"{_none(limits['max_prompt_tokens'], 'unlimited')})"),
        _line("outputs", f"{limits['outputs']} (rate limit charge {limits['rate_limit_charge']} tokens)"),
        _line("output cap", ", ".join(caps) or "none"),
        _line("stop sequences", ", ".join(repr(s) for s in limits["stop"]) or "none"),
        _line("priority", limits["priority"]),
        _line("ttft slo", "none" if limits["ttft_slo_ms"] is None else f"{limits['ttft_slo_ms']:g} ms"),
        _line("rate limit", ", ".join(rates) or "none"),
        _line("daily budget", "none" if limits["daily_budget_usd"] is None else f"${limits['daily_budget_usd']:g}"),
        _line("allowed tiers", "all" if allowed is None else ", ".join(allowed)),
    ]


def _band(band: Mapping[str, Any], last: bool) -> str:
    where = "up to 1.0" if last else f"below {band['below']:g}"
    return f"difficulty {where} -> {band['tier']}"


def _quality(quality: Mapping[str, Any]) -> list[str]:
    out = [_line("quality floor", f"{quality['floor']:g} (cheapest tier within it of the best predicted quality)")]
    if not quality["predictor"]:
        out.append(_line("quality", "no quality predictor loaded: the bands (or the default tier) decide"))
    elif not quality["predicted"]:
        out.append(_line("quality", "the predictor failed on this prompt: the bands (or the default tier) decide"))
    for option in quality.get("tiers") or ():
        marks = [m for m, on in (("best", option["tier"] == quality.get("best")),
                                 ("chosen", option["tier"] == quality.get("chosen"))) if on]
        noted = f" ({', '.join(marks)})" if marks else ""
        out.append(_line(f"quality {option['tier']}",
                         f"{option['quality']:.4f}, price ${option['price_usd']:.6f} for this request{noted}"))
    return out


def _candidate(c: Mapping[str, Any]) -> str:
    if c["healthy"] is None:
        return (f"{c['replica']} at {c['url']}: predicted ttft {c['predicted_ttft_ms']:g} ms with no traffic seen; "
                "health and load unknown (from the files: --url asks the running gateway)")
    return (f"{c['replica']} at {c['url']}: predicted ttft {c['predicted_ttft_ms']:g} ms, {c['in_flight']} in flight, "
            f"circuit {c['circuit']}, {'healthy' if c['healthy'] else 'unhealthy'}, "
            f"{c['recent_failures']} recent failures")


def _cache(cache: Mapping[str, Any]) -> list[str]:
    why: Sequence[str] = cache.get("why") or ()
    out = [_line("cache", cache["status"] + (f" (key {cache['key']})" if cache.get("key") else ""))]
    return out + [_line("not cached as", reason) for reason in why]


def _decision(decision: Mapping[str, Any]) -> str:
    if decision["status"] == 200:
        return f"200: tier {decision['tier']}, replica {_none(decision['replica'], 'in process')}"
    param = f" (field {decision['param']})" if decision.get("param") else ""
    return f"{decision['status']}: {decision['error']}{param}"
