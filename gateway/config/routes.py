"""Routes files: the tiers of the model portfolio and the replicas that serve each one."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["int4", "int8", "fp8", "fp16", "bf16", "fp32"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuHour(Frozen):
    """Price by GPU time: the request's share of an hour at the tier's measured throughput."""

    usd_per_hour: float = Field(ge=0)
    prefill_tokens_per_s: float = Field(gt=0, description="measured prompt throughput of one replica")
    decode_tokens_per_s: float = Field(gt=0, description="measured output throughput of one replica (batched)")


class Prices(Frozen):
    """USD per million tokens (or `gpu_hour`), in force from `effective_from` (UTC day) on."""

    effective_from: date | None = None
    input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float | None = Field(default=None, ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0, description="prompt tokens from the prefix cache")
    gpu_hour: GpuHour | None = None

    @model_validator(mode="after")
    def _one_way_to_price(self) -> Prices:
        by_tokens = self.input_per_mtok is not None and self.output_per_mtok is not None
        if by_tokens == (self.gpu_hour is not None):
            raise ValueError("give input_per_mtok and output_per_mtok, or gpu_hour (one of the two)")
        return self


class EmulatorLaunch(Frozen):
    """`gateway up` starts `gateway emulate` for this replica on the port of its URL."""

    kind: Literal["emulator"]
    profile: str
    seed: int = 0


class LlamaCppLaunch(Frozen):
    """`gateway up` starts llama-cpp-python's OpenAI server for this replica (the `local` extra)."""

    kind: Literal["llama_cpp"]
    model: Literal["gemma3-270m-q4_k_m", "gemma3-270m-f16"] = Field(description="a model of gateway.local.models")
    chat_format: str = "gemma"
    n_ctx: int = Field(default=2048, ge=128)
    n_threads: int = Field(default=1, ge=1)


Launch = Annotated[EmulatorLaunch | LlamaCppLaunch, Field(discriminator="kind")]


class Replica(Frozen):
    name: str = Field(min_length=1)
    url: str
    model: str = Field(min_length=1, description="model name the upstream server expects")
    launch: Launch | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host, like http://127.0.0.1:9101/v1")
        return value.rstrip("/")

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


class Tier(Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    precision: Precision
    context_window: int = Field(gt=0)
    prices: Prices | tuple[Prices, ...] = Field(description="one price, or a list by effective_from")
    replicas: tuple[Replica, ...] = Field(min_length=1)
    @field_validator("prices")
    @classmethod
    def _dated_in_order(cls, prices: Prices | tuple[Prices, ...]) -> Prices | tuple[Prices, ...]:
        if isinstance(prices, Prices):
            return prices
        if not prices:
            raise ValueError("give at least one price")
        dates = [p.effective_from for p in prices[1:]]
        if any(d is None for d in dates) or dates != sorted(set(dates)):  # type: ignore[type-var]
            raise ValueError("a list of prices needs effective_from on all but the first, in increasing order")
        return prices

    def price_at(self, day: date) -> Prices:
        """The prices in force on `day` (the first entry before any effective date)."""
        if isinstance(self.prices, Prices):
            return self.prices
        current = self.prices[0]
        for entry in self.prices[1:]:
            if entry.effective_from is not None and entry.effective_from <= day:
                current = entry
        return current

    tokenizer: str | None = Field(
        default=None,
        description="counts tokens when the backend reports no usage: a tokenizer.json path, or gguf:<local model>",
    )


class Upstream(Frozen):
    """How the gateway talks to replicas; `read_timeout_s` bounds the wait for the first byte and each gap."""

    connect_timeout_s: float = Field(default=2.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=10)


class RedisSettings(Frozen):
    """Shared state. Without `url`, `gateway serve` / `up` start an embedded Redis server."""

    url: str | None = Field(default=None, description="redis://, rediss://, redis+sentinel://, redis+cluster://")
    binary: str | None = Field(default=None, description="redis-server for the embedded one (default: found)")
    op_timeout_ms: float = Field(
        default=20.0, gt=0, description="budget of one Redis call on the request path, event-loop wait included"
    )


class RoutesConfig(Frozen):
    tiers: tuple[Tier, ...] = Field(min_length=1)
    upstream: Upstream = Upstream()
    redis: RedisSettings = RedisSettings()

    @field_validator("tiers")
    @classmethod
    def _unique_names(cls, tiers: tuple[Tier, ...]) -> tuple[Tier, ...]:
        _require_unique("tier", [t.name for t in tiers])
        _require_unique("replica", [r.name for t in tiers for r in t.replicas])
        if "auto" in {t.name for t in tiers}:
            raise ValueError("tier name 'auto' is reserved for classifier routing")
        return tiers

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)


def _require_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {kind} name {name!r}")
        seen.add(name)
