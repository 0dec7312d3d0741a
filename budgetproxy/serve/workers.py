"""Several worker processes on one port, sharing state through Redis, with merged metrics."""

from __future__ import annotations

import os

import orjson

from budgetproxy.config import Config

ENV_CONFIG_JSON = "BUDGETPROXY_CONFIG_JSON"


def app_from_env() -> object:
    """uvicorn factory for worker processes: the validated config travels as JSON in the env."""
    from budgetproxy.serve.app import create_app
    from budgetproxy.serve.server import tune_process

    config = Config.model_validate(orjson.loads(os.environ[ENV_CONFIG_JSON]))
    app = create_app(config)
    tune_process(config)
    return app


def run_workers(config: Config) -> int:
    os.environ[ENV_CONFIG_JSON] = config.model_dump_json()
    from budgetproxy.serve.server import uvicorn_config

    ucfg = uvicorn_config(
        "budgetproxy.serve.workers:app_from_env", config, host=config.server.host,
        port=config.server.port, factory=True, workers=config.server.workers,
    )
    print(f"budgetproxy listening on http://{config.server.host}:{config.server.port} "
          f"with {config.server.workers} workers", flush=True)
    sock = ucfg.bind_socket()
    from uvicorn.supervisors import Multiprocess

    Multiprocess(ucfg, sockets=[sock]).run()
    return 0
