"""`RequestResult`: what the client saw and what the request cost, one record on the context (`ctx.result`).

Owners: the edge (gateway.http, gateway.edge.accounted) writes `status`, `outcome` and `error` as the client saw them;
the account stage (gateway.stages.account) writes `cost_usd` and `priced_from`. Anyone else goes through a method
here, never by assigning a field (tests/unit/test_record_owners.py): an upstream failure or a served answer the
client closed on (`failed`, `served`), a refusal's or an anomaly's code (`flag`), the pricing of an attempt the
client left (`priced`), escalation putting back the first answer's (`put_back`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.types import Outcome


@dataclass(slots=True)
class RequestResult:
    status: int = 0
    outcome: Outcome = "ok"
    error: str | None = None
    priced_from: str | None = None  # how the backend's work was priced (accounting: PRICED_FROM); None: it did none
    cost_usd: float = 0.0  # set by accounting

    def failed(self, code: str) -> None:
        """The upstream failed mid-answer (the client's sink)."""
        self.outcome, self.error = "upstream_error", code

    def served(self) -> None:
        """The client had the whole answer, then closed (the client's sink): a served request after all."""
        self.status, self.outcome = 200, "ok"

    def flag(self, code: str | None, *, keep: bool = False) -> None:
        """Say what went wrong (`keep`: unless something already did)."""
        if not (keep and self.error is not None):
            self.error = code

    def priced(self, source: str | None) -> None:
        """How the work of an attempt the client left was priced (gateway.upstream.sink; None: none yet)."""
        self.priced_from = source

    def put_back(self, priced_from: str | None, error: str | None) -> None:
        """Escalation gives the first answer its own back when the second does not answer."""
        self.priced_from, self.error = priced_from, error
