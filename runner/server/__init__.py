"""multiseq.server: an OpenAI-compatible HTTP server on one Runner, batching concurrent clients.

    from multiseq import Runner, RunnerConfig
    from multiseq.server import create_app

    app = create_app(Runner(RunnerConfig(model="smollm2-135m", parallel=16)))   # any ASGI server runs it

`multiseq serve` runs it with uvicorn. Modules: app (routes, errors in OpenAI's shape, the API
key), jobs (an HTTP request's engine requests, bridged to the event loop), metrics (/metrics),
serve (uvicorn, the model loading behind /health, signals).
"""

from .app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
