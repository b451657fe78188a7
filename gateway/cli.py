"""`gateway serve | up | emulate | policy check | route explain | route score` and the pass-through commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from gateway.config import GatewayConfig
    from gateway.types import DifficultyScorer

DEFAULT_ROUTES = "routes/local.yaml"
DEFAULT_POLICIES = "policies/local.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in PASS_THROUGH:  # their own parsers take every option, --help included
        return _guarded(lambda: _pass_through(argv[0], argv[1:]))
    args = _parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        _parser().print_help()
        return 2
    return _guarded(lambda: int(handler(args)))


def _guarded(run: Callable[[], int]) -> int:
    try:
        return run()
    except BrokenPipeError:  # `gateway costs ... | head`
        sys.stderr.close()
        return 0


PASS_THROUGH = {
    "costs": "cost report over request logs: totals, percentiles, savings, CSV, chart",
    "train": "fit the difficulty head (--data, --from-shadow) or the quality router (--from-outcomes); train extra",
    "calibrate": "set routing bands so given shares of a prompt sample reach each tier",
    "bench": "load a server with ShareGPT or synthetic requests; TTFT/TPOT/ITL/E2E, goodput, plots",
    "experiments": "routing experiments: per-arm report with bootstrap intervals; promote an arm (policy diff)",
    "whatif": "a routes or policy change priced and timed on recorded traffic (--calibrate: against its own)",
}


def _pass_through(command: str, rest: Sequence[str]) -> int:
    if command == "costs":
        from gateway.accounting.report import run_costs

        return run_costs(rest)
    if command == "train" and "--from-outcomes" in rest:  # the quality router on measured outcomes (issue 33)
        from gateway.training.outcomes_cli import run_from_outcomes

        return run_from_outcomes(rest)
    if command == "train" and "--from-shadow" in rest:  # labels from the gateway's shadow pairs (issue 22)
        from gateway.training.shadow_labels import run_from_shadow

        return run_from_shadow(rest)
    if command == "train":
        from gateway.training.train import run_train

        return run_train(rest)
    if command == "bench":
        from gateway.bench.cli import run_bench

        return run_bench(rest)
    if command == "experiments":
        from gateway.experiments.cli import run_experiments

        return run_experiments(rest)
    if command == "whatif":
        from gateway.whatif.cli import run_whatif

        return run_whatif(rest)
    from gateway.training.calibrate import run_calibrate

    return run_calibrate(rest)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Latency-aware routing gateway for LLM inference")
    commands = parser.add_subparsers()

    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API in front of the routes' backends")
    _add_config_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="on SIGTERM, how long streams in flight may run on before they are cut (default 30)")
    _add_log_args(serve)
    _add_redis_args(serve)
    serve.set_defaults(handler=_serve)

    up = commands.add_parser("up", help="start the routes' local backends, then the gateway (what `make run` runs)")
    _add_config_args(up)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8080)
    _add_log_args(up)
    up.add_argument("--no-restart", action="store_true",
                    help="leave a local backend that exits dead (default: restart it, 1 s doubling to 30 s)")
    up.add_argument("--backend-logs", type=Path, default=Path(".gateway/logs"),
                    help="folder for each local backend's output (NAME.log)")
    _add_redis_args(up)
    up.set_defaults(handler=_up)

    emulate = commands.add_parser("emulate", help="run an OpenAI-compatible backend emulator")
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--port", type=int, required=True)
    emulate.add_argument("--profile", default="int4")
    emulate.add_argument("--seed", type=int, default=0)
    emulate.set_defaults(handler=_emulate)

    for name, summary in PASS_THROUGH.items():
        commands.add_parser(name, help=summary)

    route = commands.add_parser("route", help="routing tools").add_subparsers()
    explain = route.add_parser(
        "explain", help="show how a request would be routed (nothing is sent)",
        description="Run the routing decision for one chat request without sending it: limits applied, each tier's "
        "predicted quality and price (quality_floor), difficulty and bands, the tier and why, replica candidates, "
        "cache status and why. One fact a line; --json for the report as JSON. Exit status: 0 routed, 1 bad config "
        "or tenant, 2 the request would be refused.")
    _add_config_args(explain)
    explain.add_argument("--tenant", required=True, help="the tenant's name in the policy file (required)")
    explain.add_argument("--prompt", required=True, help="the user message's text (required)")
    explain.add_argument("--model", default="auto",
                         help="the model asked for: auto, or a tier name (default: %(default)s)")
    explain.add_argument("--max-tokens", type=int, help="the request's max_tokens (default: none, the policy's)")
    explain.add_argument("--json", action="store_true", help="print the report as JSON (default: one fact a line)")
    explain.add_argument("--session-id", help="the conversation's x-session-id, to show what its session holds "
                         "(default: none, the session of the prompt alone)")
    explain.add_argument("--redis", metavar="URL",
                         help="the gateway's Redis, where sessions are kept (default: none, sessions not looked up)")
    explain.add_argument("--url", metavar="URL",
                         help="ask the running gateway at URL (POST /admin/explain): its live replica health and load, "
                         "its sessions (default: none, decided from the files; replica health unknown)")
    explain.add_argument("--admin-key", metavar="KEY", default=None,
                         help="the admin API key for --url (default: $GATEWAY_ADMIN_KEY)")
    explain.set_defaults(handler=_route_explain)
    score = route.add_parser(
        "score", help="predict each tier's answer quality for a JSONL of prompts, and the gain",
        description="Read one {\"id\", \"prompt\"} a line; write one {\"id\", \"quality\": {tier: score}, \"gain\"} a "
        "line, gain = the dearest tier's predicted quality minus the cheapest's (sweep thresholds on it with any "
        "tool). Tiers: the routes file's chat tiers with a quality_model the predictor knows.")
    score.add_argument("input", type=Path, metavar="IN.jsonl", help="prompts, one {id, prompt} a line")
    score.add_argument("output", type=Path, metavar="OUT.jsonl", help="where the scores are written")
    score.add_argument("--routes", type=Path, default=Path(DEFAULT_ROUTES),
                       help="the tiers and their quality_model (default: %(default)s)")
    score.add_argument("--predictor", type=Path, default=Path("models/router"),
                       help="the quality predictor's folder (default: %(default)s)")
    score.add_argument("--max-tokens", type=int, default=256,
                       help="output tokens each tier's price assumes (default: %(default)s)")
    score.add_argument("--floors", type=_floats, default=(), metavar="F,F,...",
                       help="print each floor's tier shares and predicted quality (default: none)")
    score.set_defaults(handler=_route_score)

    policy = commands.add_parser("policy", help="policy file tools").add_subparsers()
    check = policy.add_parser(
        "check", help="validate routes and policy files as the server does, cross-file rules included (exit 1 if "
        "any is invalid, or a policy has no valid routes file)", description="Each policy is checked with --routes, "
        "else the routes file of the same name among PATHS, else the only routes file among them, else routes/<its "
        "name> beside its folder; without one, or beside an invalid one, the check fails (exit 1) as the server "
        "would refuse the pair, and says why.")
    check.add_argument("paths", nargs="+", type=Path, metavar="PATHS", help="routes and policy files")
    check.add_argument("--routes", type=Path, metavar="FILE", help="check every policy against this routes file")
    check.add_argument("--previous", type=Path, metavar="FILE", help="the policy serving now: refuse what a reload "
                       "refuses, a tenant or a set field it has and the new file lacks without `removes:` naming it")
    check.set_defaults(handler=_policy_check)
    schema = policy.add_parser("schema", help="print the JSON Schema of policy (or routes) files, for editors")
    schema.add_argument("--routes", action="store_true", help="the routes file schema instead")
    schema.set_defaults(handler=_policy_schema)
    return parser


def _add_log_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-file", type=Path, help="append request log lines here instead of stdout")
    parser.add_argument("--log-max-bytes", type=int, help="rotate the log file at this size")
    parser.add_argument("--log-backups", type=int, default=7, help="rotated files kept (size rotation)")
    parser.add_argument("--log-daily", action="store_true", help="rotate the log file at midnight UTC")
    parser.add_argument("--shadow-pairs", type=Path, default=Path(".gateway/shadow-pairs.jsonl"), metavar="PATH",
                        help="append shadow comparison pairs here, for `gateway train --from-shadow` "
                             "(written only when a policy has a `shadow:` rule)")


def _add_redis_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--redis-url", help="shared Redis (default: routes file's redis.url, else an embedded server)")
    group.add_argument("--no-redis", action="store_true", help="run without Redis: no caches, local limits")


@contextmanager
def _redis(args: argparse.Namespace, config: GatewayConfig) -> Iterator[str | None]:
    """The Redis URL to use; starts (and finally stops) an embedded server when none is configured."""
    url = args.redis_url or config.routes.redis.url
    if args.no_redis or url:
        yield None if args.no_redis else url
        return
    from gateway.local.redis_server import EmbeddedRedis

    with EmbeddedRedis(config.routes.redis.binary) as server:
        print(f"embedded Redis on {server.url} (log: {server.log_path})", file=sys.stderr)
        yield server.url


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--routes", type=Path, default=Path(DEFAULT_ROUTES),
                        help="the routes file: tiers and their replicas (default: %(default)s)")
    parser.add_argument("--policies", type=Path, default=Path(DEFAULT_POLICIES),
                        help="the policy file: tenants and their limits (default: %(default)s)")


def _load(args: argparse.Namespace) -> GatewayConfig | None:
    """The config, its tiers' tokenizers loaded once to check them (as a reload and `policy check` do)."""
    from gateway.config import ConfigError, load_config
    from gateway.config.tokenizers import check_tokenizers

    try:
        config = load_config(args.routes, args.policies)
    except ConfigError as err:
        for issue in err.issues:
            print(issue, file=sys.stderr)
        return None
    issues = check_tokenizers(args.routes, config.routes)
    for issue in issues:
        print(issue, file=sys.stderr)
    return None if issues else config


def _servable(args: argparse.Namespace) -> GatewayConfig | None:
    """The config, when the gateway can serve with it: the files load, and tracing (when on) asks for an
    OTLP protocol the exporter speaks (OTEL_EXPORTER_OTLP_PROTOCOL=grpc is refused here, with the reason)."""
    from gateway.tracing import UnsupportedProtocol, check_tracing

    config = _load(args)
    if config is not None:
        try:
            check_tracing(config.routes.tracing)
        except UnsupportedProtocol as err:
            print(f"gateway: {err}", file=sys.stderr)
            return None
    return config


def _scorer(config: GatewayConfig) -> DifficultyScorer | None:
    """The difficulty classifier the policy's bands need (None when no tenant, and no experiment arm, routes by
    bands). An arm's bands read the same folder as the rest of the policy (the loader refuses others)."""
    from gateway.config.tenants import classifier_folders

    tenants = [*config.tenants_by_key_hash.values(), *([config.anonymous] if config.anonymous else [])]
    base, arms_only = classifier_folders(tenants)
    folders = base or arms_only
    if not folders:
        return None
    if len(folders) > 1:
        print(f"one classifier per gateway: using {folders[0]} (also named: {', '.join(folders[1:])})", file=sys.stderr)
    from gateway.classifier.difficulty import load_classifier

    from gateway.routing.tools import model_folder

    path = model_folder(folders[0])
    classifier = load_classifier(path, cuts=band_cuts(config))
    cascade = "" if classifier.cascade is None else f", cascade on (cuts {', '.join(f'{c:g}' for c in classifier.cascade.cuts or ())})"
    print(f"classifier {path} on {classifier.provider}{cascade}", file=sys.stderr)
    return classifier


def band_cuts(config: GatewayConfig) -> tuple[float, ...]:
    """Every cut a difficulty band of this config has (each tenant's bands and each experiment arm's): the
    scores the classifier's cascade must not guess across."""
    tenants = [*config.tenants_by_key_hash.values(), *([config.anonymous] if config.anonymous else [])]
    routings = [t.routing for t in tenants]
    routings += [a.policy.routing for t in tenants if t.plan for e in t.plan.experiments for a in e.arms]
    return tuple(sorted({b.below for r in routings if r is not None for b in r.bands
                         if b.below is not None and b.below < 1.0}))


class _ServedCuts:
    """The band cuts of the config an app serves now, recomputed when a reload swaps the config in."""

    def __init__(self, app: web.Application) -> None:
        from gateway.state import GATEWAY

        self._gateway = app[GATEWAY]
        self._config: GatewayConfig | None = None
        self._cuts: tuple[float, ...] = ()

    def __call__(self) -> tuple[float, ...]:
        config = self._gateway.config
        if config is not self._config:
            self._config, self._cuts = config, band_cuts(config)
        return self._cuts


def _follow_reloads(scorer: DifficultyScorer | None, app: web.Application) -> web.Application:
    """Let the classifier's cascade follow the cuts of reloaded policies (it reads them before each score)."""
    from gateway.classifier.difficulty import DifficultyClassifier

    if isinstance(scorer, DifficultyClassifier) and scorer.cascade is not None:
        scorer.follow_cuts(_ServedCuts(app))
    return app


@contextmanager
def _logging(args: argparse.Namespace) -> Iterator[None]:
    """Configure the JSON log (a rotating file or stdout); the file is closed however serving ends."""
    from gateway.accounting.log import configure_logging
    from gateway.accounting.logfile import RotatingLogFile

    if args.log_file is None:
        batched = configure_logging(None)
        try:
            yield
        finally:
            batched.drain()  # stdout stays open
        return
    stream = RotatingLogFile(args.log_file, max_bytes=args.log_max_bytes, backups=args.log_backups,
                             daily=args.log_daily)
    batched = configure_logging(stream)
    try:
        yield
    finally:
        batched.close()


def _serve(args: argparse.Namespace) -> int:
    from gateway import server
    from gateway.app import create_app
    from gateway.routing.tools import serving_predictor

    config = _servable(args)
    if config is None:
        return 1
    with _logging(args), _redis(args, config) as redis_url:
        print(f"gateway listening on http://{args.host}:{args.port}/v1 (config {config.version})", file=sys.stderr)
        scorer = _scorer(config)
        predictor = serving_predictor(config, scorer)
        app = _follow_reloads(scorer, create_app(config, scorer, redis_url, config_files=(args.routes, args.policies),
                                                 shadow_pairs=args.shadow_pairs, predictor=predictor))
        try:
            server.run(server.serve_until_signal(app, args.host, args.port, drain_timeout_s=args.drain_timeout))
        finally:
            if predictor is not None:
                predictor.close()
    return 0


def _up(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.local.up import up
    from gateway.routing.tools import serving_predictor

    config = _servable(args)
    if config is None:
        return 1
    with _logging(args), _redis(args, config) as redis_url:
        scorer = _scorer(config)
        predictor = serving_predictor(config, scorer)
        app = _follow_reloads(scorer, create_app(config, scorer, redis_url, config_files=(args.routes, args.policies),
                                                 shadow_pairs=args.shadow_pairs, predictor=predictor))
        try:
            return up(config, app, args.host, args.port, str(args.log_file or "stdout"), args.backend_logs,
                      restart=not args.no_restart)
        finally:
            if predictor is not None:
                predictor.close()


def _emulate(args: argparse.Namespace) -> int:
    from gateway import server
    from gateway.emulator.server import run_emulator

    server.run(run_emulator(args.host, args.port, args.profile, args.seed))
    return 0


async def _explained(config: GatewayConfig, args: argparse.Namespace, body: dict[str, Any], scorer: Any,
                     predictor: Any) -> dict[str, Any]:
    """The explain report from the files, with the session `--session-id` names looked up in `--redis` when given."""
    from gateway.backends.pool import ReplicaPool
    from gateway.cache.connection import connect
    from gateway.cache.guard import RedisGuard
    from gateway.routing.explain import explain, file_steps
    from gateway.routing.sessions import SessionStore

    guard = RedisGuard(connect(args.redis), op_timeout_s=2.0) if args.redis else None
    try:
        pool = ReplicaPool()
        steps = file_steps(pool, SessionStore(guard) if guard is not None else None)
        return await explain(config, args.tenant, body, scorer=scorer, predictor=predictor, pool=pool, steps=steps,
                             session_header=args.session_id)
    finally:
        if guard is not None:
            await guard.client.aclose()


def _asked(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """The report of the running gateway at `--url` (POST /admin/explain); ValueError saying why there is none."""
    import json
    import os
    import urllib.error
    import urllib.request

    key = args.admin_key or os.environ.get("GATEWAY_ADMIN_KEY")
    if not key:
        raise ValueError("--url needs the admin API key: --admin-key KEY or GATEWAY_ADMIN_KEY")
    payload = {"tenant": args.tenant, "request": body, **({"session_id": args.session_id} if args.session_id else {})}
    url = args.url.rstrip("/")
    url = url[:-3] if url.endswith("/v1") else url
    request = urllib.request.Request(f"{url}/admin/explain", data=json.dumps(payload).encode(), method="POST",
                                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            report: dict[str, Any] = json.loads(answer.read())
            return report
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = err.reason
        raise ValueError(f"{url}/admin/explain answered {err.code}: {message}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ValueError(f"cannot reach {url}: {getattr(err, 'reason', err)}") from None


def _route_explain(args: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from gateway.errors import GatewayError
    from gateway.routing.explain_text import lines
    from gateway.routing.tools import serving_predictor

    body = {"model": args.model, "messages": [{"role": "user", "content": args.prompt}]}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.url:
        try:
            report = _asked(args, body)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    else:
        config = _load(args)
        if config is None:
            return 1
        scorer = _scorer(config)
        predictor = serving_predictor(config, scorer)
        try:
            report = asyncio.run(_explained(config, args, body, scorer, predictor))
        except GatewayError as err:
            print(f"error: {err.message}", file=sys.stderr)
            return 1
        finally:
            if predictor is not None:
                predictor.close()
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else "\n".join(lines(report)))
    return 0 if report["decision"]["status"] == 200 else 2


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"floors are in [0, 1], got {text!r}")
    return values


def _route_score(args: argparse.Namespace) -> int:
    from gateway.routing.tools import run_score

    return run_score(args)


def _policy_schema(args: argparse.Namespace) -> int:
    import orjson

    from gateway.config import PolicyConfig, RoutesConfig

    model = RoutesConfig if args.routes else PolicyConfig
    print(orjson.dumps(model.model_json_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    from gateway.config.check import check_paths

    results = check_paths(args.paths, args.routes, args.previous)
    for result in results:
        print("\n".join(result.lines()))
    return 0 if all(result.ok for result in results) else 1
