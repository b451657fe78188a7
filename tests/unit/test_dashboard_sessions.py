"""Dashboard sessions (issue 37): opaque random tokens mapped server side to a key's hash, expiring, bounded."""

from __future__ import annotations

from gateway.dashboard.routes import DashboardSessions


def test_a_session_is_a_random_token_that_expires() -> None:
    now = [0.0]
    sessions = DashboardSessions(ttl_s=60, clock=lambda: now[0])
    token = sessions.open("digest-a")
    assert token != "digest-a" and len(token) >= 40 and sessions.open("digest-a") != token
    assert sessions.key_sha256(token) == "digest-a" and sessions.key_sha256("guess") is None
    now[0] = 59.9
    assert sessions.key_sha256(token) == "digest-a"
    now[0] = 60.0
    assert sessions.key_sha256(token) is None  # expired, and gone
    sessions.close(token)


def test_sessions_are_bounded_and_closed() -> None:
    now = [0.0]
    sessions = DashboardSessions(ttl_s=10, max_sessions=3, clock=lambda: now[0])
    tokens = [sessions.open(f"d{i}") for i in range(4)]
    assert sessions.key_sha256(tokens[0]) is None and len(sessions) == 3  # the oldest made room
    sessions.close(tokens[3])
    assert sessions.key_sha256(tokens[3]) is None
    now[0] = 11.0
    sessions.open("d9")  # opening sweeps the expired ones
    assert len(sessions) == 1
