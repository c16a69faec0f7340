"""The server's own page: GET / (a live view of every model's slots, and a chat box), its script
and style, and the state it draws, for scripts too: GET /status (JSON) and GET /status/events
(server-sent events, at each change). Off with --no-webui (llama-server's flag); /status stays.

The page's files are plain, readable files served as they are (no build step, nothing fetched
from elsewhere: the machine may be offline). They are the only thing served without the API
key: the page asks for the key and sends it with every call. A strict Content-Security-Policy
lets the page run its own script and call its own server, nothing else.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .sse import EventStream

FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "app.css": "text/css; charset=utf-8"}
PAGE_PATHS = ("/", "/page/app.js", "/page/app.css")  # served without the key: the page, so that it can ask for it
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _read(name: str) -> bytes:
    return resources.files("multiseq.server").joinpath("page", name).read_bytes()


async def index(request: HttpRequest) -> Response:
    request.app.state.server.monitor.start()
    return Response(_read("index.html"), media_type=FILES["index.html"], headers=SECURITY_HEADERS)


async def page_file(request: HttpRequest) -> Response:
    name = request.path_params["name"]
    if name not in FILES or name == "index.html":
        return JSONResponse({"error": {"message": f"The page has no file {name!r}.", "type": "not_found_error"}},
                            status_code=404)
    return Response(_read(name), media_type=FILES[name], headers=SECURITY_HEADERS)


async def status(request: HttpRequest) -> Response:
    """The page's state as JSON: every model's slots and queue, the plots' history, the errors."""
    monitor = request.app.state.server.monitor
    monitor.start()
    return JSONResponse(monitor.state())


async def status_events(request: HttpRequest) -> Response:
    """The page's state at once, then at each change (at most 4 times a second)."""
    monitor = request.app.state.server.monitor
    monitor.start()
    return EventStream(monitor.events(), on_disconnect=lambda: None)


def routes(with_page: bool) -> list[Route]:
    status_routes = [Route("/status", status, methods=["GET"]), Route("/status/events", status_events, methods=["GET"])]
    if not with_page:
        return status_routes
    return [Route("/", index, methods=["GET"]), Route("/page/{name}", page_file, methods=["GET"]), *status_routes]
