"""GET /dashboard (the page), /dashboard/data.json (what it draws) and /dashboard/static/ (uPlot, the
page's script); POST /dashboard/login and /dashboard/logout.

The page and its data need the policy's admin key or one of its dashboard viewer keys: as a bearer token
(scripts), or through a session. A browser logs in by POSTing the key in a form body to /dashboard/login
(never in the address, where it would reach history, proxies and access logs); the gateway answers with an
opaque session token (256 random bits) in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) and keeps,
server side, token -> (the SHA-256 of the key, expiry). The cookie never holds the key. A session lasts
SESSION_TTL_S, ends at logout, and ends as soon as its key leaves the policy (each use checks the key's hash
against the serving policy). Sessions live in the gateway process that made them (at most MAX_SESSIONS,
the oldest dropped first): behind a load balancer without affinity, log in on each replica, or use the key
as a bearer token. `?key=` in the address is refused (the login page), never taken.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import orjson
from aiohttp import web

from gateway.state import GATEWAY, Gateway
from gateway.dashboard.replicas import replica_rows
from gateway.dashboard.snapshot import snapshot
from gateway.edge.accounted import accounted, refuse
from gateway.errors import AuthenticationFailed, NotFound, error_body

STATIC = Path(__file__).parent / "static"
STATIC_FILES = {path.name: path for path in STATIC.iterdir() if path.is_file()}
COOKIE = "gateway_dashboard"
SESSION_TTL_S = 8 * 3600
MAX_SESSIONS = 10_000
MAX_LOGIN_BYTES = 4096
LOGIN = b"""<!doctype html><meta charset="utf-8"><title>gateway dashboard</title>
<form method="post" action="/dashboard/login" style="font:16px sans-serif;margin:4em">
<p>The dashboard needs the admin key or a dashboard viewer key.</p>
<input type="password" name="key" autocomplete="current-password" autofocus> <button>Open</button></form>"""


class DashboardSessions:
    """Opaque session token -> (the key's SHA-256, expiry on the monotonic clock), oldest first."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def open(self, key_sha256: str) -> str:
        token = secrets.token_urlsafe(32)
        now = self._clock()
        self._sessions[token] = (key_sha256, now + self.ttl_s)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        self._expire(now)
        return token

    def key_sha256(self, token: str) -> str | None:
        """The key hash of a live session, or None (unknown or expired)."""
        found = self._sessions.get(token)
        if found is None:
            return None
        digest, expires = found
        if self._clock() >= expires:
            del self._sessions[token]
            return None
        return digest

    def close(self, token: str) -> None:
        self._sessions.pop(token, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self, now: float) -> None:
        while self._sessions:
            token, (_, expires) = next(iter(self._sessions.items()))
            if expires > now:
                return
            del self._sessions[token]


SESSIONS = web.AppKey("dashboard_sessions", DashboardSessions)


def add_routes(app: web.Application) -> None:
    app[SESSIONS] = DashboardSessions()
    app.router.add_get("/dashboard", accounted(page))
    app.router.add_post("/dashboard/login", accounted(login))
    app.router.add_post("/dashboard/logout", accounted(logout))
    app.router.add_get("/dashboard/data.json", accounted(data))
    app.router.add_get("/dashboard/static/{name}", accounted(static_file))


async def static_file(request: web.Request) -> web.StreamResponse:
    """One of the dashboard's own files (the page's script, styles and the plotting library), by name only: no
    other path can be asked for."""
    path = STATIC_FILES.get(request.match_info["name"])
    if path is None:
        return refuse(request, NotFound(f"no dashboard file {request.match_info['name'][:64]!r}"))
    return web.FileResponse(path)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def _known(gateway: Gateway, digest: str) -> bool:
    """Whether `digest` is the admin key's or a viewer key's under the serving policy."""
    policy = gateway.config.policy
    stored = [*policy.dashboard_viewer_keys_sha256, *filter(None, [policy.admin_api_key_sha256])]
    return any(hmac.compare_digest(digest, known) for known in stored)


def _allowed(request: web.Request, gateway: Gateway) -> bool:
    """Whether the request carries the admin key or a viewer key as a bearer token, or a live session whose
    key the policy still holds."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return _known(gateway, _digest(token.strip()))
    session = request.cookies.get(COOKIE)
    if not session:
        return False
    digest = request.app[SESSIONS].key_sha256(session)
    return digest is not None and _known(gateway, digest)


def _login_page(status: int = 401) -> web.Response:
    return web.Response(body=LOGIN, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})


async def page(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    if "key" in request.query:  # the old `?key=` login: a key in the address is never taken
        return _login_page()
    if not _allowed(request, gateway):
        return _login_page()
    return web.FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-store"})


async def login(request: web.Request) -> web.StreamResponse:
    """POST /dashboard/login, form body `key=...`: a session cookie and a redirect to the page, or the login
    page again (401)."""
    gateway = request.app[GATEWAY]
    if request.content_length is not None and request.content_length > MAX_LOGIN_BYTES:
        return _login_page(413)
    raw = await request.content.read(MAX_LOGIN_BYTES + 1)
    if len(raw) > MAX_LOGIN_BYTES:
        return _login_page(413)
    form = _form_key(raw)
    digest = _digest(form) if form else None
    if digest is None or not _known(gateway, digest):
        return _login_page()
    sessions = request.app[SESSIONS]
    response = web.HTTPSeeOther("/dashboard", headers={"Cache-Control": "no-store"})
    response.set_cookie(COOKIE, sessions.open(digest), path="/dashboard", httponly=True, samesite="Strict",
                        secure=request.secure, max_age=int(sessions.ttl_s))
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    session = request.cookies.get(COOKIE)
    if session:
        request.app[SESSIONS].close(session)
    response = web.HTTPSeeOther("/dashboard")
    response.del_cookie(COOKIE, path="/dashboard")
    raise response


def _form_key(raw: bytes) -> str | None:
    """The `key` field of a urlencoded form body (None when absent or not UTF-8)."""
    from urllib.parse import parse_qs

    try:
        text = raw.decode("ascii")
        fields = parse_qs(text, keep_blank_values=False, strict_parsing=False, encoding="utf-8", errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get("key")
    return values[0].strip() if values else None


async def data(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if not _allowed(request, gateway):
        err = AuthenticationFailed("the dashboard needs the admin key or a dashboard viewer key")
        return web.Response(body=error_body(err), status=err.status, content_type="application/json")
    gates = gateway.path.admission.gates if gateway.path is not None else {}
    redis = "off" if gateway.redis is None else gateway.redis.status().state  # up, partial (cluster), down
    body = snapshot(gateway.metrics.live, gateway.config, gates, redis)
    body["replicas"] = replica_rows(gateway.pool, gateway.config)
    return web.Response(body=orjson.dumps(body), content_type="application/json",
                        headers={"Cache-Control": "no-store"})
