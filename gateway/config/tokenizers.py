"""The tiers' token counters, built when a routes file is validated, not when the first request needs one.

A tokenizer that passes the routes schema (the file exists) may still not load (not a tokenizer.json, a GGUF
llama.cpp cannot read). The server builds its counters at start and on every reload before the new version
serves, and `gateway policy check` builds them the same way: all three refuse such a file alike, naming the
file, the line and field (`tiers[i].tokenizer`) and the loader's reason.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config.loader import ConfigError, ConfigIssue, check_file, load_routes, locate
from gateway.config.routes import RoutesConfig
from gateway.tokens import TokenCounters, default_tokenizer_path

MAX_REASON_CHARS = 300  # a loader's message can quote the file it choked on


def build_counters(routes: RoutesConfig, counters: TokenCounters) -> None:
    """Load every tier's counter into `counters` (one per spec; those already there are kept); raises a
    ConfigError naming each tier whose tokenizer does not load (file "routes": `locate` places it)."""
    issues = []
    for index, tier in enumerate(routes.tiers):
        try:
            counters.for_spec(tier.tokenizer)
        except Exception as err:  # whatever the tokenizer library raises for a file it cannot read
            reason = f"{type(err).__name__}: {err}"
            if len(reason) > MAX_REASON_CHARS:
                reason = reason[:MAX_REASON_CHARS] + "..."
            shown = repr(tier.tokenizer) if tier.tokenizer else f"unset (the default {default_tokenizer_path()})"
            issues.append(ConfigIssue("routes", None, f"tiers[{index}].tokenizer", shown,
                                      f"the tokenizer does not load: {reason}"))
    if issues:
        raise ConfigError(issues)


def check_tokenizers(routes_path: str | Path, routes: RoutesConfig) -> list[ConfigIssue]:
    """`build_counters` into a throwaway set, its issues located in `routes_path` (`gateway policy check`)."""
    try:
        build_counters(routes, TokenCounters())
    except ConfigError as err:
        return list(locate(err, routes_path).issues)
    return []


def check_routes_file(path: str | Path) -> list[ConfigIssue]:
    """A routes file as the server loads it: its schema (`check_file`), then its tiers' tokenizers built."""
    issues = check_file(path)
    return issues or check_tokenizers(path, load_routes(path))
