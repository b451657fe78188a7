"""API keys from request headers, the one place the edge reads them.

aiohttp decodes header bytes as UTF-8 with `surrogateescape`: a byte that is not UTF-8 becomes a lone
surrogate, which no hash or comparison can encode. Such a key is refused here as a 401 (the caller renders
it in its protocol's shape and logs the request), never passed on to fail later as a 500.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import AuthenticationFailed

UNDECODABLE = "the API key is not valid UTF-8"


def decodable(value: str) -> bool:
    """Whether a header value came from valid UTF-8 (it holds no lone surrogate)."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of `Authorization: Bearer <token>` (None when absent or another scheme); 401 when undecodable."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not (token := token.strip()):
        return None
    return token if token.isascii() else checked(token)  # ASCII: valid UTF-8, nothing to check


def api_key(headers: Mapping[str, str], key_header: str | None = None) -> str | None:
    """The request's API key: the bearer token, else the protocol's own `key_header` (Anthropic's x-api-key)."""
    key = bearer(headers)
    if key is None and key_header is not None and (own := headers.get(key_header)) is not None:
        key = checked(own)
    return key


def checked(key: str) -> str:
    """`key`, or AuthenticationFailed (401) when its bytes were not UTF-8."""
    if not decodable(key):
        raise AuthenticationFailed(UNDECODABLE, code="invalid_api_key_encoding")
    return key
