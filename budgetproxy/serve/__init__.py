"""Serving: the ASGI app and its lifespan, the episode API, the uvicorn server and its workers."""
