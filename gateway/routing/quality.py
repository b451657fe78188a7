"""Routing on predicted answer quality: the choice `quality_floor` makes, for the route stage, `gateway route
explain` and `gateway route score`.

Each chat tier with a `quality_model` (routes/) gets the quality predictor's score for that model: the answer
quality it is expected to reach on this prompt, in [0, 1]. Each gets a price for the request (its prompt
tokens and `max_tokens` at today's prices). The tenant's floor then picks the cheapest tier whose predicted
quality is within `floor` of the best tier's: 0 takes the best tier, 1 the cheapest.

    options = tier_options(predictions, tiers, prompt_tokens=120, completion_tokens=256, day=date.today())
    choice = choose(options, floor=0.05)   # None: no tier has a prediction
    choice.tier, choice.reason
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from operator import itemgetter
from typing import NamedTuple

from gateway.config import Tier

TIE = 1e-9  # predictions this close to the floor count as within it


class TierOption(NamedTuple):
    """One tier as quality routing sees it."""

    tier: str
    quality: float  # the predicted score of the tier's quality_model
    price_usd: float  # this request's price on the tier (prompt tokens + max_tokens)


_PRICE = itemgetter(2)
_QUALITY = itemgetter(1)


@dataclass(frozen=True, slots=True)
class QualityChoice:
    chosen: TierOption
    best: TierOption  # the tier with the highest predicted quality (the cheapest of equal bests)
    floor: float
    options: tuple[TierOption, ...]  # cheapest first

    @property
    def tier(self) -> str:
        return self.chosen.tier

    @property
    def reason(self) -> str:
        """Why, in one line of ASCII (a response header, a log field and `route explain` show it)."""
        chosen, best = self.chosen, self.best
        if chosen is best:
            cheaper = [o for o in self.options if o.price_usd < chosen.price_usd]
            if not cheaper:
                return f"quality: {chosen.tier} is the best ({chosen.quality:.3f}) and the cheapest"
            near = max(cheaper, key=_QUALITY)
            return (f"quality: {chosen.tier} is the best ({chosen.quality:.3f}); cheaper tiers predict less than "
                    f"{best.quality - self.floor:.3f} (best - floor {self.floor:g}; {near.tier} {near.quality:.3f})")
        return (f"quality: {chosen.tier} ({chosen.quality:.3f}) is the cheapest within floor {self.floor:g} of the "
                f"best, {best.tier} ({best.quality:.3f})")


def tier_options(predictions: Mapping[str, float], tiers: Iterable[Tier], *, prompt_tokens: int,
                 completion_tokens: int, day: date) -> list[TierOption]:
    """The chat tiers with a predicted quality, cheapest first (ties: in the routes file's order). A tier is
    left out without a quality_model, when the predictor does not know its model, or when the prediction is not
    a number in [0, 1]."""
    options = []
    for tier in tiers:
        model = tier.quality_model
        if model is None or tier.endpoint != "chat":
            continue
        quality = predictions.get(model, math.nan)
        if 0.0 <= quality <= 1.0:
            price = tier.price_at(day).cost_usd(prompt_tokens, completion_tokens)
            options.append(TierOption(tier.name, float(quality), price))
    options.sort(key=_PRICE)  # stable
    return options


def choose(options: Sequence[TierOption], floor: float) -> QualityChoice | None:
    """The cheapest option whose quality is at least the best's minus `floor`; None without options."""
    if not options:
        return None
    ordered = tuple(sorted(options, key=_PRICE))
    best = max(ordered, key=_QUALITY)  # the first (cheapest) of equal bests
    bar = best.quality - floor - TIE
    pick = next(o for o in ordered if o.quality >= bar)
    return QualityChoice(pick, best, floor, ordered)


def gain(options: Sequence[TierOption]) -> float | None:
    """Predicted quality of the dearest tier minus the cheapest's (higher: more need for the dearest tier);
    None with fewer than two tiers."""
    if len(options) < 2:
        return None
    ordered = sorted(options, key=_PRICE)
    return ordered[-1].quality - ordered[0].quality
