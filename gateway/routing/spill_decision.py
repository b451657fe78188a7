"""Spill's decision, a pure function of the tenant's rule and the tiers' forecasts (gateway.routing.spill runs it
over the live pool; `gateway whatif` can call it on a log). Apart from the step so that the request's context can
hold a `SpillChoice` without importing the step (and the metrics it reports to)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gateway.config import Spill, Tier
from gateway.routing.quality import TIE


class Forecast(NamedTuple):
    """One tier as spill sees it for this request."""

    tier: Tier
    ttft_s: float | None  # its best replica's predicted TTFT, queue included (None: no replica may be tried)
    quality: float | None = None  # its predicted answer quality (None: no prediction)


class SpillChoice(NamedTuple):
    """What spill decided: the tier serving, and both tiers' predictions."""

    tier: Tier  # the tier that serves
    chosen: Forecast  # the tier routing chose (the one that serves when nothing spilled)
    target: Forecast | None  # the tier spilled to (None: kept)
    slo_s: float
    reason: str

    @property
    def spilled_from(self) -> str | None:
        return None if self.target is None else self.chosen.tier.name

    @property
    def quality_loss(self) -> float | None:
        """Predicted quality given up by the spill (negative: gained; None: kept, or not predicted)."""
        target = self.target
        if target is None or target.quality is None or self.chosen.quality is None:
            return None
        return self.chosen.quality - target.quality

    def report(self) -> dict[str, object]:
        """The decision as data: the log line's `spill` field and `route explain`'s."""
        return {"slo_ms": round(self.slo_s * 1000, 3), "from": _forecast(self.chosen),
                "to": None if self.target is None else _forecast(self.target),
                "quality_loss": None if (loss := self.quality_loss) is None else round(loss, 4),
                "reason": self.reason}


def _forecast(forecast: Forecast) -> dict[str, object]:
    return {"tier": forecast.tier.name,
            "ttft_ms": None if forecast.ttft_s is None else round(forecast.ttft_s * 1000, 1),
            "quality": None if forecast.quality is None else round(forecast.quality, 4)}


def spill_tier(rule: Spill, chosen: Forecast, ladder: Sequence[Forecast]) -> SpillChoice:
    """The tier serving a request routed to `chosen.tier`. `ladder`: the tiers the tenant may use for it, cheapest
    first, `chosen` among them (by quality: those with a prediction; by bands: the routes file's order). With a
    quality prediction for the chosen tier, spill goes by quality; without one, to the next tier down (or up)."""
    slo = rule.ttft_slo_ms / 1000
    if chosen.ttft_s is None or chosen.ttft_s <= slo:
        why = "no replica may be tried" if chosen.ttft_s is None else f"{ms(chosen.ttft_s)} within the SLO"
        return SpillChoice(chosen.tier, chosen, None, slo, f"kept {chosen.tier.name}: {why}")
    position = next((i for i, f in enumerate(ladder) if f.tier.name == chosen.tier.name), None)
    if position is None:
        return SpillChoice(chosen.tier, chosen, None, slo, f"kept {chosen.tier.name}: not on the tenant's ladder")
    if chosen.quality is not None:
        below = ladder[:position]
        above = ladder[position + 1:] if rule.spill_up else ()
        bar = chosen.quality - rule.max_quality_loss - TIE
        fits = [f for f in (*below, *above) if f.ttft_s is not None and f.ttft_s <= slo
                and f.quality is not None and f.quality >= bar]
        how = f"quality at least {chosen.quality - rule.max_quality_loss:.3f}"
    else:  # bands only: the neighbours
        near = [*ladder[position - 1:position], *(ladder[position + 1:position + 2] if rule.spill_up else ())]
        fits = [f for f in near if f.ttft_s is not None and f.ttft_s <= slo]
        how = "the next tier down" + (" or up" if rule.spill_up else "")
    over = f"{chosen.tier.name} predicted {ms(chosen.ttft_s)} > SLO {rule.ttft_slo_ms:g} ms"
    if not fits:
        return SpillChoice(chosen.tier, chosen, None, slo, f"kept {chosen.tier.name}: {over}; no tier within the "
                           f"SLO with {how}")
    target = fits[0]  # the cheapest
    quality = "" if target.quality is None or chosen.quality is None else \
        f", quality {target.quality:.3f} vs {chosen.quality:.3f}"
    return SpillChoice(target.tier, chosen, target, slo,
                       f"spilled: {over}; {target.tier.name} predicted {ms(target.ttft_s)}{quality}")


def ms(seconds: float | None) -> str:
    """A predicted TTFT as the reasons say it."""
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"
