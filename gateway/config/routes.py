"""Routes files: the tiers of the model portfolio and the replicas that serve each one."""

from __future__ import annotations

import hashlib
import os
import ssl
from functools import cached_property
from pathlib import Path
from datetime import date
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.backends.urls import redact_url

T = TypeVar("T")
Precision = Literal["int4", "int8", "fp8", "fp16", "bf16", "fp32"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuHour(Frozen):
    """Price by GPU time: the request's share of an hour at the tier's measured throughput."""

    usd_per_hour: float = Field(ge=0)
    prefill_tokens_per_s: float = Field(gt=0, description="measured prompt throughput of one replica")
    decode_tokens_per_s: float = Field(gt=0, description="measured output throughput of one replica (batched)")


def nano_usd(usd: float) -> float:
    """`usd` to the nano-dollar: round(usd, 9) but for ties within a float's error of half a nano-dollar, at a
    third of its instructions (round with digits goes through a decimal string; a log line prices several)."""
    return round(usd * 1e9) / 1e9


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

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """USD for the tokens actually processed, rounded to a nano-dollar (per request: attributes read once)."""
        gpu = self.gpu_hour
        if gpu is not None:
            seconds = prompt_tokens / gpu.prefill_tokens_per_s + completion_tokens / gpu.decode_tokens_per_s
            return nano_usd(seconds * gpu.usd_per_hour / 3600)
        input_rate, cached_rate, output_rate = self.input_per_mtok, self.cached_input_per_mtok, self.output_per_mtok
        assert input_rate is not None and output_rate is not None
        cached = cached_tokens if cached_tokens < prompt_tokens else prompt_tokens
        total = ((prompt_tokens - cached) * input_rate + cached * (input_rate if cached_rate is None else cached_rate)
                 + completion_tokens * output_rate)
        return nano_usd(total / 1_000_000)


class EmulatorLaunch(Frozen):
    """`gateway up` starts `gateway emulate` for this replica on the port of its URL."""

    kind: Literal["emulator"]
    profile: str
    seed: int = 0


class LlamaCppLaunch(Frozen):
    """`gateway up` starts llama.cpp's own `llama-server` for this replica (built by `gateway.local.llama_build`)."""

    kind: Literal["llama_cpp"]
    model: Literal["gemma3-270m-q4_k_m", "gemma3-270m-f16"] = Field(description="a model of gateway.local.models")
    chat_format: str = Field(default="gemma", description="llama.cpp's built-in chat template of that name "
                             "(the GGUF carries none); the tier's `gguf:` tokenizer renders the same")
    n_ctx: int = Field(default=2048, ge=128, description="context of one request (each slot gets this much)")
    n_threads: int = Field(default=1, ge=1)
    parallel: int = Field(default=1, ge=1, description="slots: requests decoded together (continuous batching)")
    embedding: bool = Field(default=False, description="serve /v1/embeddings instead of completions")
    pooling: Literal["mean", "cls", "last"] | None = Field(
        default=None, description="how an embedding server pools token vectors (the model's own when unset)")


Launch = Annotated[EmulatorLaunch | LlamaCppLaunch, Field(discriminator="kind")]


class ReplicaTls(Frozen):
    """TLS to one https:// replica (a private vLLM endpoint): whom to trust and who the gateway is. Files are
    read at load time (paths relative to the working directory); a file that does not load is refused."""

    ca_file: str | None = Field(default=None, description="PEM bundle of the CAs the replica's certificate must "
                                "chain to, instead of the system's")
    cert_file: str | None = Field(default=None, description="client certificate (PEM) shown to the replica; with "
                                  "key_file")
    key_file: str | None = Field(default=None, description="private key (PEM, unencrypted) of cert_file")
    verify: bool = Field(default=True, description="false: the replica's certificate and host name are not "
                         "checked (test setups only)")

    @field_validator("ca_file")
    @classmethod
    def _ca_loads(cls, path: str | None) -> str | None:
        if path is not None:
            _tls_file(lambda: ssl.create_default_context().load_verify_locations(cafile=path), path)
        return path

    @model_validator(mode="after")
    def _identity_loads(self) -> ReplicaTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give cert_file and key_file together")
        self.__dict__["context"] = _tls_file(self._shared_context, self.cert_file or self.ca_file or "")
        return self

    def _shared_context(self) -> ssl.SSLContext:
        """One context per value of these settings, the files' contents included: a reload that loads the same
        settings gets the same object, so the upstream client's pool of connections for it (keyed by it) is
        found again, not stranded; a rotated certificate or CA bundle makes a new one."""
        value = (self.verify, _digest(self.ca_file), _digest(self.cert_file), _digest(self.key_file))
        context = _CONTEXTS.get(value)
        if context is None:
            context = _CONTEXTS[value] = self._context()
        return context

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    @cached_property
    def context(self) -> ssl.SSLContext:
        """The SSL context built at load time (`_identity_loads`), shared by the replica's connections."""
        return self._shared_context()


_CONTEXTS: dict[tuple[bool, bytes | None, bytes | None, bytes | None], ssl.SSLContext] = {}  # by TLS settings' value


def _digest(path: str | None) -> bytes | None:
    return None if path is None else hashlib.sha256(Path(path).read_bytes()).digest()


def _tls_file(load: Callable[[], T], path: str) -> T:
    try:
        return load()
    except FileNotFoundError:
        raise ValueError(f"no file {path}") from None
    except (OSError, ssl.SSLError) as err:  # unreadable, not PEM, a key that is not the certificate's
        raise ValueError(f"cannot load {path}: {getattr(err, 'reason', None) or err}") from None


class Replica(Frozen):
    name: str = Field(min_length=1)
    url: str
    model: str = Field(min_length=1, description="model name the upstream server expects")
    launch: Launch | None = None
    tls: ReplicaTls | None = Field(default=None, description="https:// only: the replica's own CA bundle, client "
                                   "certificate, or no verification")
    api_key_env: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable with this backend's API key, read at load time, sent as Bearer",
    )
    prefix_cache_salt: bool = Field(
        default=False, description="send vLLM's per-request `cache_salt` (vLLM >= 0.9, V1 engine): a digest of "
        "the tenant's cache scope, so the backend's prefix cache reuses a prompt prefix only within one tenant (or "
        "the tenants whose policies share the cache). Off by default: servers that validate their fields (OpenAI's "
        "API, vLLM's V0 engine) refuse it; llama.cpp's llama-server accepts and ignores it (no isolation there). "
        "The tier's prefix_cache_salt is the default")

    @field_validator("name")
    @classmethod
    def _name_shows_no_secret(cls, name: str) -> str:
        """A replica's name is shown to tenants (502 bodies) and in log lines: a URL there must carry no secret."""
        if redact_url(name) != name:
            raise ValueError("a replica name is shown in error messages and logs: it must not hold a URL's "
                             "credentials or query values (name it, e.g. vllm-a-0, and keep the URL in url)")
        return name

    @field_validator("api_key_env")
    @classmethod
    def _env_is_set(cls, name: str | None) -> str | None:
        if name is not None and not os.environ.get(name):
            raise ValueError(f"environment variable {name} is not set (or empty)")
        return name

    def model_post_init(self, context: Any) -> None:
        self.__dict__["api_key"] = os.environ[self.api_key_env] if self.api_key_env is not None else None

    @cached_property
    def api_key(self) -> str | None:
        """This backend's own credential (from `api_key_env`, read at load time by `model_post_init`; a plain
        attribute on the request path, never dumped, never in repr); the client's key never goes upstream."""
        return os.environ[self.api_key_env] if self.api_key_env is not None else None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host, like http://127.0.0.1:9101/v1")
        parts.port  # raises ValueError for a port outside 0-65535
        return value.rstrip("/")

    @model_validator(mode="after")
    def _tls_needs_https(self) -> Replica:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError("tls is for https:// replicas only")
        return self

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """The replica's own TLS context (None: the system's CAs for https://)."""
        return self.tls.context if self.tls is not None else None

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


class InProcessEncoder(Frozen):
    """An embedding tier served in the gateway process: the MiniLM sentence encoder it ships
    (all-MiniLM-L6-v2, 384 dimensions), behind the in-process and Redis embedding caches."""

    kind: Literal["minilm"]

    dimensions: ClassVar[int] = 384


class Tier(Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    precision: Precision
    context_window: int = Field(gt=0)
    prices: Prices | tuple[Prices, ...] = Field(description="one price, or a list by effective_from")
    replicas: tuple[Replica, ...] = Field(default=(), description="at least one, unless `embedder` serves the tier")
    endpoint: Literal["chat", "embeddings"] = Field(
        default="chat", description="what the tier serves: chat (/v1/chat/completions and the APIs translated to it, "
        "/v1/completions) or embeddings (/v1/embeddings, sent to the replicas' /embeddings; an `embedder` tier is one)")
    dimensions: int | None = Field(
        default=None, ge=1, description="embedding tiers: the length of the vectors the model returns (required with "
        "replicas; 384 for `embedder`); requests may leave `dimensions` out or ask for exactly this")
    embedder: InProcessEncoder | None = Field(
        default=None, description="an embedding tier served in process (/v1/embeddings); it has no replicas")
    native: tuple[Literal["responses"], ...] = Field(
        default=(), description="APIs the replicas serve themselves (vLLM: responses), sent upstream as they came; "
        "the others are translated to chat completions")
    prefix_cache_salt: bool = Field(
        default=False, description="the default of the replicas' prefix_cache_salt (vLLM's cache_salt, a digest "
        "of the tenant's cache scope: the backend's prefix cache kept per tenant); a replica's own setting wins")

    @model_validator(mode="before")
    @classmethod
    def _salt_replicas(cls, data: Any) -> Any:
        """The tier's prefix_cache_salt is its replicas' default."""
        if isinstance(data, dict) and data.get("prefix_cache_salt") is True and isinstance(data.get("replicas"),
                                                                                           (list, tuple)):
            replicas = [{"prefix_cache_salt": True, **r} if isinstance(r, dict) else r for r in data["replicas"]]
            return {**data, "replicas": replicas}
        return data

    @model_validator(mode="before")
    @classmethod
    def _embedder_embeds(cls, data: Any) -> Any:
        """An `embedder` tier serves embeddings of the encoder's size: said once, here, for every reader."""
        if isinstance(data, dict) and data.get("embedder") is not None:
            return {"endpoint": "embeddings", "dimensions": InProcessEncoder.dimensions, **data}
        return data

    @model_validator(mode="after")
    def _served(self) -> Tier:
        if bool(self.replicas) == (self.embedder is not None):
            raise ValueError("give replicas, or an in-process embedder (one of the two)")
        if self.embedder is not None and self.endpoint != "embeddings":
            raise ValueError("an embedder tier serves embeddings: leave endpoint out or set it to embeddings")
        if self.endpoint == "chat":
            if self.dimensions is not None:
                raise ValueError("dimensions is for embedding tiers (endpoint: embeddings)")
            return self
        if self.embedder is not None and self.dimensions != InProcessEncoder.dimensions:
            raise ValueError(f"the {self.embedder.kind} encoder makes {InProcessEncoder.dimensions} dimensions, "
                             f"not {self.dimensions}")
        if self.dimensions is None:
            raise ValueError("an embedding tier with replicas needs dimensions: the length of its model's vectors")
        if self.native:
            raise ValueError("native is for chat tiers: an embedding tier serves /v1/embeddings only")
        if self.prefix_cache_salt or any(r.prefix_cache_salt for r in self.replicas):
            raise ValueError("prefix_cache_salt is for chat tiers (vLLM's prefix cache): an embedding tier has none")
        return self

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

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_known(cls, spec: str | None) -> str | None:
        """Checked when the file loads (start, reload, `gateway policy check`), not when it first counts a stream."""
        if spec is None or spec == "emulator":
            return spec
        if spec.startswith("gguf:"):
            from gateway.local.models import F16, Q4
            from gateway.tokens import CHAT_TEMPLATES

            model, _, chat_format = spec.removeprefix("gguf:").partition(":")
            if model not in (Q4, F16):
                raise ValueError(f"unknown local model {model!r}: use gguf:{Q4} or gguf:{F16}")
            if chat_format and chat_format not in CHAT_TEMPLATES:
                raise ValueError(f"unknown chat format {chat_format!r}; known: {', '.join(CHAT_TEMPLATES)}")
            return spec
        if not os.path.isfile(spec):
            raise ValueError("no tokenizer.json file there (nor 'emulator' or gguf:<local model>)")
        return spec
    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="first guess of one replica's prefill speed (learned from traffic after)"
    )
    slots_per_replica: int | None = Field(
        default=None, ge=1, description="requests one replica runs at once (vLLM --max-num-seqs): admission "
        "never admits more than the tier's replicas can run, and a full replica predicts a queue"
    )
    brownout_to: str | None = Field(
        default=None, description="a faster tier that takes this tier's 'auto' traffic when it is saturated"
    )
    quality_model: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="the measured model (or rung of a quality ladder) that stands for this tier's answers: "
        "the name the quality predictor knows (models/router/MODEL_CARD.md lists them); routing by a "
        "policy's quality_floor chooses among the tiers that have one")


class Upstream(Frozen):
    """How the gateway talks to replicas; `read_timeout_s` bounds the wait for the first byte and each gap."""

    connect_timeout_s: float = Field(default=2.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=10)


class Breaker(Frozen):
    """Per replica: `failures` in a row open the circuit for `cooldown_s` (doubling up to `max_cooldown_s`)."""

    failures: int = Field(default=5, ge=1)
    cooldown_s: float = Field(default=5.0, gt=0)
    max_cooldown_s: float = Field(default=60.0, gt=0)


class RetryBudget(Frozen):
    """Retries allowed: `ratio` of the requests of the last `window_s`, plus `min_per_s` (Finagle's budget)."""

    ratio: float = Field(default=0.2, ge=0, le=1)
    min_per_s: float = Field(default=1.0, ge=0)
    window_s: float = Field(default=10.0, gt=0)


class Balancing(Frozen):
    """Replica choice inside a tier: lowest predicted TTFT, prefix affinity, live load from the backends."""

    strategy: Literal["predicted_ttft", "round_robin"] = Field(
        default="predicted_ttft", description="round_robin: plain rotation (a baseline; affinity still applies)"
    )
    affinity_margin: float = Field(
        default=1.5, ge=1.0, description="the affine replica wins unless its predicted TTFT exceeds the best by this factor"
    )
    affinity_slack_ms: float = Field(default=50.0, ge=0, description="...and by at least this much")
    near_tie: float = Field(default=0.1, ge=0, description="predictions within this fraction are near-ties (P2C)")
    ewma_alpha: float = Field(default=0.2, gt=0, le=1, description="weight of a new TTFT/TPOT sample")
    explore_after_s: float = Field(
        default=5.0, ge=0, description="a replica not sent a request for this long is tried again (put first once), "
        "and a TTFT sample after such a gap outweighs the old ones; 0: off"
    )
    scrape_interval_s: float = Field(default=1.0, ge=0, description="backends' /metrics (vLLM names); 0: off")
    health_interval_s: float = Field(default=5.0, ge=0, description="active health checks; 0: off")
    breaker: Breaker = Breaker()
    retry_budget: RetryBudget = RetryBudget()


class Admission(Frozen):
    """Per tier: an adaptive concurrency limit (gradient on TTFT) and a bounded queue with deadlines."""

    enabled: bool = True
    initial_limit: int = Field(default=32, ge=1)
    min_limit: int = Field(default=2, ge=1)
    max_limit: int = Field(default=512, ge=1)
    ttft_target_ms: float = Field(default=400.0, gt=0, description="TTFT the limit steers below")
    max_queue: int = Field(default=256, ge=0, description="waiting requests per tier; beyond: 503")
    max_wait_ms: float = Field(default=1000.0, gt=0, description="longest wait in the queue without a TTFT SLO")
    batch_share: float = Field(
        default=0.1, ge=0, le=1, description="share of freed slots given to waiting batch requests first"
    )

    @model_validator(mode="after")
    def _limits_in_order(self) -> Admission:
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("need min_limit <= initial_limit <= max_limit")
        return self


class RedisSettings(Frozen):
    """Shared state. Without `url`, `gateway serve` / `up` start an embedded Redis server."""

    url: str | None = Field(default=None, description="redis://, rediss://, redis+sentinel://, redis+cluster://")
    binary: str | None = Field(default=None, description="redis-server for the embedded one (default: found)")
    op_timeout_ms: float = Field(
        default=20.0, gt=0, description="budget of one Redis call on the request path, event-loop wait included"
    )
    limits_timeout_ms: float = Field(
        default=2000.0, gt=0, description="budget of the rate-limit call: the limiter waits this long for Redis "
        "(a busy event loop makes replies late; the socket timeout is 2 s) before it decides on this replica's share"
    )
    expected_replicas: int = Field(
        default=1, ge=1, description="gateway replicas at least: while Redis is down each admits its limits divided "
        "by this or the count its heartbeats saw, whichever is larger"
    )


class TracingSettings(Frozen):
    """OpenTelemetry traces over OTLP/HTTP. Present: on; unset fields fall back to the standard OTEL_*
    variables. Absent: on only when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set. Read at start, not reloaded."""

    endpoint: str | None = Field(default=None, description="collector base URL, e.g. http://otel-collector:4318")
    sample_ratio: float | None = Field(default=None, ge=0, le=1, description="share of new traces kept "
                                       "(parent-based: a caller's sampled trace is always continued)")
    service_name: str | None = Field(default=None, description="service.name (default: OTEL_SERVICE_NAME, llm-gateway)")


class RoutesConfig(Frozen):
    tiers: tuple[Tier, ...] = Field(min_length=1)
    upstream: Upstream = Upstream()
    balancing: Balancing = Balancing()
    admission: Admission = Admission()
    redis: RedisSettings = RedisSettings()
    tracing: TracingSettings | None = None

    @field_validator("tiers")
    @classmethod
    def _unique_names(cls, tiers: tuple[Tier, ...]) -> tuple[Tier, ...]:
        _require_unique("tier", [t.name for t in tiers])
        _require_unique("replica", [r.name for t in tiers for r in t.replicas])
        endpoints = {t.name: t.endpoint for t in tiers}
        if "auto" in endpoints:
            raise ValueError("tier name 'auto' is reserved for classifier routing")
        for t in tiers:
            if t.brownout_to is not None and (endpoints.get(t.brownout_to) != t.endpoint or t.brownout_to == t.name):
                raise ValueError(f"tier {t.name!r}: brownout_to {t.brownout_to!r} is not another {t.endpoint} tier")
        return tiers

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)


def _require_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {kind} name {name!r}")
        seen.add(name)
