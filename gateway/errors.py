"""The gateway's one error tree and its one translation to the OpenAI error JSON.

    GatewayError                       500 api_error (never shown with a traceback)
     ├── InvalidRequest                400 invalid_request_error (param names the field)
     │    ├── BodyTooLarge             413
     │    ├── RequestTimeout           408 (the body did not arrive in time)
     │    ├── UnsupportedMediaType     415 (a Content-Encoding the gateway does not decode)
     │    └── UnknownModel             404 model_not_found
     ├── AuthenticationFailed          401 authentication_error
     ├── PermissionDenied              403 permission_error
     ├── NotFound                      404 not_found_error (unknown path)
     ├── MethodNotAllowed              405 invalid_request_error
     ├── RateLimited                   429 rate_limit_error (+ Retry-After)
     ├── Overloaded                    503 overloaded_error (+ Retry-After)
     └── UpstreamError                 502 upstream_error (all replicas failed before the first byte)
          ├── UpstreamTimeout          504
          └── UpstreamOverloaded       503 (the replicas answered 429; + Retry-After)
    UpstreamStatus                     an upstream 4xx passed through with its own body

Stages raise these; only `error_body` turns them into bytes for the client.
"""

from __future__ import annotations

import orjson


class GatewayError(Exception):
    status = 500
    type = "api_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class RequestTimeout(InvalidRequest):
    status = 408
    code = "request_timeout"


class UnsupportedMediaType(InvalidRequest):
    status = 415
    code = "unsupported_content_encoding"


class UnknownModel(InvalidRequest):
    status = 404
    code = "model_not_found"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"


class Overloaded(GatewayError):
    status = 503
    type = "overloaded_error"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504


class UpstreamOverloaded(UpstreamError):
    status = 503


class UpstreamStatus(GatewayError):
    """An upstream 4xx that is the client's fault: passed through with the upstream's message."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after, code="upstream_rejected")
        self.status = status


def error_body(err: GatewayError) -> bytes:
    """The OpenAI error JSON: {"error": {"message", "type", "param", "code"}}."""
    return orjson.dumps(
        {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
    )
