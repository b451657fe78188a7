"""The tenants' rate limits and daily budgets on the log's clock, with the limiter's own windows.

The gateway's Redis script decides: the day's spend against the budget first, then the requests window,
then the tokens window, and charges both windows only when all pass; after the answer, the token charge
is corrected to the tokens used and the spend is added (`gateway.limits.limiter`). Here the same minute
windows (`LocalWindows`, `WindowPosition`: the sliding-window arithmetic both paths share) and day totals
(`LocalBudgets`) run at each request's arrival time from the log, for the whole fleet (one window per
tenant, as Redis keeps), and each request's booking lands when it finished (arrival + its e2e time).
"""

from __future__ import annotations

import heapq
import itertools

from gateway.clock import day_key
from gateway.config.tenants import TenantPolicy
from gateway.limits.limiter import local_key
from gateway.limits.local import LocalBudgets, LocalWindows
from gateway.limits.window import WindowPosition


class ReplayLimits:
    """Admission against each tenant's limits at logged times (see the module docstring)."""

    def __init__(self) -> None:
        self._windows = LocalWindows()
        self._budgets = LocalBudgets()
        self._due: list[tuple[float, int, TenantPolicy, int, float]] = []  # (when, seq, tenant, token delta, usd)
        self._seq = itertools.count()
        self.exhausted: dict[tuple[str, str], float] = {}  # (tenant, day) -> when its budget was first used up

    def admit(self, tenant: TenantPolicy, token_cost: int, now: float) -> str | None:
        """None when admitted (and charged), else the error code the gateway answers 429 with."""
        self._settle(now)
        rate, budget = tenant.rate_limit, tenant.daily_budget_usd
        if rate is None and budget is None:
            return None
        position = WindowPosition.at(now)
        if budget is not None:
            day = day_key(now)
            if self._budgets.spent(tenant.name, day) >= budget:
                self.exhausted.setdefault((tenant.name, day), now)
                return "budget_exhausted"
        windows = self._windows
        if rate is not None and rate.requests_per_min is not None:
            if windows.admit(local_key(tenant, "req"), 1, rate.requests_per_min, position) is not None:
                return "rate_limit_requests"
        if rate is not None and rate.tokens_per_min is not None:
            if windows.admit(local_key(tenant, "tok"), token_cost, rate.tokens_per_min, position) is not None:
                if rate.requests_per_min is not None:  # the script charges neither window when one refuses
                    windows.adjust(local_key(tenant, "req"), -1, position)
                return "rate_limit_tokens"
        return None

    def book(self, tenant: TenantPolicy, token_delta: int, cost_usd: float, when: float) -> None:
        """After the answer (at `when`): the token charge corrected by `token_delta`, the spend added."""
        tokens = tenant.rate_limit is not None and tenant.rate_limit.tokens_per_min is not None and token_delta != 0
        spend = tenant.daily_budget_usd is not None and cost_usd > 0
        if tokens or spend:
            heapq.heappush(self._due, (when, next(self._seq), tenant, token_delta if tokens else 0,
                                       cost_usd if spend else 0.0))

    def spent(self, tenant: str, day: str) -> float:
        return self._budgets.spent(tenant, day)

    def _settle(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            when, _, tenant, delta, usd = heapq.heappop(due)
            if delta:
                self._windows.adjust(local_key(tenant, "tok"), delta, WindowPosition.at(when))
            if usd:
                self._budgets.add(tenant.name, day_key(when), usd)
