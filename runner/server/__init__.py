"""multiseq.server: an OpenAI-compatible HTTP server on one Runner, batching concurrent clients.

    from multiseq import Runner, RunnerConfig
    from multiseq.server import create_app

    app = create_app(Runner(RunnerConfig(model="smollm2-135m", parallel=16)))   # any ASGI server runs it

`multiseq serve` runs it with uvicorn. Modules: app (routes, errors in OpenAI's shape, the API
key), jobs (an HTTP request's engine requests, bridged to the event loop), metrics (/metrics),
serve (uvicorn, the model loading behind /health, signals).
"""

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str):
    """The app is imported on first use: `multiseq batch-run` reads the server's defaults
    (multiseq.server.limits) without loading Starlette, uvicorn and the Batch API's store."""
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
