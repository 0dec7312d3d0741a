"""The baseline forwarder: the practical limit for a Python proxy on budgetproxy's server stack.

One Starlette route served by uvicorn (uvloop + httptools, one worker), one shared aiohttp
ClientSession, the JSON body parsed once with orjson, the response passed through (streams
chunk by chunk as they arrive).

    python bench/minimal_forwarder.py --upstream http://127.0.0.1:8000/v1 --port 8001
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# Hop-by-hop and framing headers are the server's business, not the upstream's.
_DROP = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-connection",
    "accept-encoding",
}


def create_app(upstream: str) -> Starlette:
    target = upstream.rstrip("/") + "/chat/completions"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            app.state.session = session
            yield

    async def chat(request: Request) -> Response:
        body = await request.body()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return Response(b'{"error":{"message":"bad json"}}', 400, media_type="application/json")
        stream = isinstance(payload, dict) and payload.get("stream") is True
        headers = {k: v for k, v in request.headers.items() if k not in _DROP}
        session: aiohttp.ClientSession = request.app.state.session
        upstream_resp = await session.post(target, data=body, headers=headers)
        media_type = upstream_resp.headers.get("content-type")
        if not stream or upstream_resp.status != 200:
            data = await upstream_resp.read()
            upstream_resp.release()
            return Response(data, upstream_resp.status, media_type=media_type)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream_resp.content.iter_any():
                    yield chunk
            finally:
                upstream_resp.release()

        return StreamingResponse(relay(), upstream_resp.status, media_type=media_type)

    return Starlette(
        routes=[Route("/v1/chat/completions", chat, methods=["POST"])], lifespan=lifespan
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    # The same uvicorn settings as `budgetproxy serve` (budgetproxy/serve/server.py).
    uvicorn.run(
        create_app(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_keep_alive=30,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
