"""Who may come in: the API key, the Host a request names, and the site a browser sends it from.

Three ASGI middlewares around the routes, outermost first:

- SiteGuard: the `Host` header must name this server (the address the client connected to,
  `localhost`, `127.0.0.1`, `[::1]`, or one of `allowed_hosts`), else 421: a page whose DNS
  name was rebound to 127.0.0.1 names its own host, and is refused. A request with an `Origin`
  (a browser's, sent by a page) from any site but this server's own is refused with 403 unless
  `cors_origins` allows it.
- Starlette's CORSMiddleware, only with `cors_origins`: CORS headers for the origins allowed,
  and their preflight `OPTIONS` answered (before the key: browsers send none with a preflight).
- ApiKeyGuard: with an API key, every route but `/health`, the page's own files (`/`, its
  script and style: the page asks for the key) and `/metrics` when it is public wants it. Paths are taken relative to the app's `root_path`, as the router takes them, so an
  app mounted under a prefix is guarded the same.

Refusals are in the shape of the API asked: Anthropic's on /v1/messages, OpenAI's elsewhere.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from . import messages
from .chat import IGNORED_FIELDS_HEADER
from .errors import INVALID_REQUEST, error_body

ANY = "*"
# Names of this machine's loopback that a local client may put in Host.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# Addresses that bind every interface: the Host a client uses cannot be known from them.
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})
HEALTH_PATH, METRICS_PATH = "/health", "/metrics"
HEALTH_PATHS = (HEALTH_PATH, "/v1/health")  # llama-server answers both, without a key
MISDIRECTED = 421  # RFC 9110: the request names an authority this server does not answer for
FORBIDDEN = 403
UNAUTHORIZED = 401


def route_path(scope: Scope) -> str:
    """The request's path as the app's router matches it: relative to the app's `root_path`
    when it is mounted under a prefix (Starlette keeps the whole path in scope["path"])."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):]
    return path


def refusal(scope: Scope, status: int, message: str, code: str, kind: str = INVALID_REQUEST,
            headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answered before any route ran, in the shape of the API the path belongs to."""
    if route_path(scope).startswith(messages.ENDPOINT):
        error_type = messages.ERROR_TYPES_BY_STATUS.get(status, "invalid_request_error")
        return JSONResponse(messages.error_body(error_type, message), status_code=status, headers=headers)
    return JSONResponse(error_body(message, kind, None, code), status_code=status, headers=headers)


def parse_list(value: str | None) -> tuple[str, ...]:
    """A comma-separated option (`--allowed-hosts a,b`) as its non-empty entries."""
    return tuple(entry.strip() for entry in (value or "").split(",") if entry.strip())


def allowed_hosts_for(bound_host: str, given: Iterable[str]) -> tuple[str, ...]:
    """The Host names a server bound to `bound_host` answers for, besides loopback and the
    address a client connected to: those given, and the bound name itself (`--host my.lan`).
    Bound to every interface with none given, any (the caller warns: clients may name the
    machine in ways it cannot know)."""
    given = tuple(given)
    if not given and bound_host in WILDCARD_ADDRESSES:
        return (ANY,)
    return given + (bound_host,) if bound_host not in WILDCARD_ADDRESSES else given


def _host_name(authority: str) -> str | None:
    """The host of `host[:port]` (`[v6]:port` too), lowercased; None when it is not one."""
    try:
        return urlsplit(f"//{authority}").hostname
    except ValueError:  # a bracket left open, a port that is not a number
        return None


class SiteGuard:
    """Refuses a request whose Host names another server, or whose Origin is another site's."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = (), cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        entries = [entry.lower() for entry in allowed_hosts]
        self._any_host = ANY in entries
        self._host_names = {_host_name(entry) or entry for entry in entries if not entry.startswith("*.")}
        self._host_suffixes = tuple(entry[1:] for entry in entries if entry.startswith("*."))  # ".example.com"
        origins = [origin.lower().rstrip("/") for origin in cors_origins]
        self._any_origin = ANY in origins
        self._origins = frozenset(origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self._is_host_allowed(host, scope):
            await refusal(scope, MISDIRECTED, f"This server does not answer for the host {host!r}: use its address, "
                                              f"localhost, or a host given with --allowed-hosts.",
                          "host_not_allowed")(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and not self._is_origin_allowed(origin, host):
            await refusal(scope, FORBIDDEN, f"Requests from the web origin {origin!r} are not allowed: allow it "
                                            f"with --cors-origins.", "origin_not_allowed",
                          "permission_error")(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _is_host_allowed(self, host: str, scope: Scope) -> bool:
        if self._any_host:
            return True
        name = _host_name(host) if host else None
        if name is None:
            return False
        server = scope.get("server") or (None, None)  # the address the client connected to
        connected = str(server[0]).lower() if server[0] is not None else None
        return (name in LOOPBACK_HOSTS or name == connected or name in self._host_names
                or any(name.endswith(suffix) for suffix in self._host_suffixes))

    def _is_origin_allowed(self, origin: str, host: str) -> bool:
        """This server's own pages (the origin names the same host and port), or an allowed one."""
        normalized = origin.lower().rstrip("/")
        if self._any_origin or normalized in self._origins:
            return True
        try:
            return urlsplit(normalized).netloc == host.lower() != ""
        except ValueError:
            return False


class ApiKeyGuard:
    """Every route but /health, the page's files (`page_paths`) and /metrics when
    `metrics_public` wants the key, as
    `Authorization: Bearer <key>` or as Anthropic's `x-api-key: <key>`, compared in constant
    time. An unknown path wants it too, so a client without the key learns nothing of the
    routes."""

    def __init__(self, app: ASGIApp, api_key: str | None, metrics_public: bool = False,
                 page_paths: Iterable[str] = ()) -> None:
        self.app = app
        self._key = api_key.encode("utf-8") if api_key else None
        self._open_paths = frozenset({*HEALTH_PATHS, *page_paths, *([METRICS_PATH] if metrics_public else [])})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and self._key is not None and route_path(scope) not in self._open_paths
                and not self._is_authorized(Headers(scope=scope))):
            message = "Incorrect or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
            await refusal(scope, UNAUTHORIZED, message, "invalid_api_key", INVALID_REQUEST,
                          {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _is_authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        offered = [headers.get("x-api-key", "").strip(), token.strip() if scheme.lower() == "bearer" else ""]
        # Both compared, never short-circuited, so the time taken says nothing about the key.
        matches = [hmac.compare_digest(key.encode("utf-8"), self._key) for key in offered]
        return any(matches)


def cors_options(cors_origins: Iterable[str]) -> dict:
    """CORSMiddleware's keywords for the origins allowed (`*`: any): every method and header a
    client of these APIs sends (Authorization, x-api-key, anthropic-version, ...)."""
    origins = list(cors_origins)
    return {"allow_origins": [ANY] if ANY in origins else origins, "allow_methods": [ANY], "allow_headers": [ANY],
            "expose_headers": [IGNORED_FIELDS_HEADER, messages.IGNORED_TOOLS_HEADER]}
