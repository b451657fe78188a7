"""A replica's URL with a path added or taken off, its query string kept where it belongs (after the path):
`https://x/openai/deployments/d?api-version=2024-10-21` + `/models` is `.../deployments/d/models?api-version=...`."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def with_path(url: str, path: str) -> str:
    """`url` with `path` appended to its path, before its query string."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def without_suffix(url: str, suffix: str) -> str:
    """`url` with `suffix` (e.g. "/v1") taken off the end of its path, its query string kept."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/").removesuffix(suffix)))
