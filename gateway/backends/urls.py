"""A replica's URL with a path added or taken off, its query string kept where it belongs (after the path):
`https://x/openai/deployments/d?api-version=2024-10-21` + `/models` is `.../deployments/d/models?api-version=...`.

And a URL as it may be shown (`redact_url`): a replica URL can carry credentials (`http://user:pass@host/v1?token=`),
so every place that prints one (upstream error bodies and log lines, config issues in /admin/config and
`policy check`, /admin/explain, tracing endpoints) prints it through here, never whole."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


def with_path(url: str, path: str) -> str:
    """`url` with `path` appended to its path, before its query string."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def without_suffix(url: str, suffix: str) -> str:
    """`url` with `suffix` (e.g. "/v1") taken off the end of its path, its query string kept."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/").removesuffix(suffix)))


# Query parameters whose values are shown as they are: names known to carry no secret. Every other value is
# replaced, whatever its name (`token`, `sig`, `code`, `key` and the names nobody thought of).
PUBLIC_QUERY_NAMES = frozenset({"api-version", "api_version"})
REDACTED = "***"
# in free text a URL ends at a space or a quote; its query (which may hold a space) only at a quote or line end
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>?#]*(?:[?#][^'\"<>\n]*)?")


def redact_url(url: str) -> str:
    """`url` as it may be shown (error bodies, log lines, /admin, explain, `policy check`): its userinfo
    (`user:pass@`) and every query value but those of PUBLIC_QUERY_NAMES replaced by `***`, its fragment too.

    Works on text that is not a valid URL (a port out of range, spaces, unbalanced brackets): it splits on
    the characters alone, and over-redacts rather than under (everything before the last `@` of the part
    ahead of the query is taken for userinfo)."""
    head, mark, rest = url.partition("://")
    if not mark:
        return url
    rest, hashmark, _ = rest.partition("#")
    before_query, question, query = rest.partition("?")
    if "@" in before_query:
        before_query = REDACTED + "@" + before_query.rpartition("@")[2]
    if question:
        query = "&".join(_redact_pair(pair) for pair in query.split("&"))
    return f"{head}{mark}{before_query}{question}{query}{hashmark + REDACTED if hashmark else ''}"


def redact_urls_in(text: str) -> str:
    """`text` with every URL in it (scheme://...) redacted as `redact_url` does; a cheap test when there is none."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match[0]), text) if "://" in text else text


def _redact_pair(pair: str) -> str:
    name, equals, value = pair.partition("=")
    if not equals:  # a bare word: may itself be the secret
        return REDACTED if name else name
    return pair if name.lower() in PUBLIC_QUERY_NAMES else f"{name}={REDACTED}"
