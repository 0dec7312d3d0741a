"""The systems under test: how each is configured, started, checked for readiness and stopped."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
LITELLM_VENV = BENCH_DIR / ".litellm-venv"
LITELLM_SPEC = "litellm[proxy]==1.106.12"
# Portkey's gateway, pinned in bench/portkey/package.json (and its lock file)
PORTKEY_DIR = BENCH_DIR / "portkey"
PORTKEY_INSTALL = "npm ci --prefix bench/portkey --no-audit --no-fund"
# A budget no benchmark run can spend: episodes are counted but never refused.
EPISODE_BUDGET = 1_000_000_000
EPISODES = 64

SERVER_CORE = "1"
CLIENT_CORE = "0"


@dataclass
class Target:
    """One row of the benchmark: a URL to load, and the process behind it (if any)."""

    name: str
    description: str
    base_url: str = ""  # OpenAI base URL, ending in /v1
    episodes: int = 0  # >0: each request carries one of this many X-Episode-Id values
    auth: str = ""  # bearer token the load generator sends
    headers: str = ""  # further request headers the load generator sends ("Name: value; ...")
    body_fields: str = ""  # members added to every request body ('"name":value,...')
    forwards_headers: bool = True  # X-Fake-* steering headers reach the upstream
    warmup_s: float = 1.0  # load before measuring: pools, caches, lazy imports
    min_run_s_c256: float = 0.0  # slow servers finish nothing at c=256 in a short run
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    skip: str = ""  # why this row was not measured
    notes: list[str] = field(default_factory=list)

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def header_dict(self) -> dict[str, str]:
        """`headers` as a mapping ("Name: value; Name: value", as wrk_chat.lua reads it)."""
        out = {}
        for part in self.headers.split(";"):
            name, sep, value = part.partition(":")
            if sep and name.strip():
                out[name.strip()] = value.strip()
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin_to_client_core(shared: str) -> list[str]:
    """Move this process (the load generator) to the client core; notes on what could not be
    done. `shared` names what shares the one core on a single-core machine."""
    notes = []
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(CLIENT_CORE)})
    else:
        notes.append(f"single core: {shared} share it")
    if not shutil.which("taskset"):
        notes.append("taskset not found: processes are not pinned")
    return notes


def percentile(values: Iterable[float], q: float, digits: int = 3) -> float | None:
    """The q-th percentile (nearest rank, rounded), or None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], digits)


async def sse_data(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The payloads of an SSE body's `data:` lines, `[DONE]` included."""
    async for raw in lines:
        line = raw.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


def pinned(core: str, argv: list[str]) -> list[str]:
    """Prefix ``argv`` with taskset when the machine has it and more than one core."""
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        return ["taskset", "-c", core, *argv]
    return argv


def spawn(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None, core: str = SERVER_CORE,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    try:
        return subprocess.Popen(
            pinned(core, argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    finally:
        log.close()


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process (and its group, for servers with workers), then SIGKILL if stuck."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _tail(path: Path | None, lines: int = 6) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:])


def wait_ready(target: Target, timeout: float = 60.0) -> bool:
    """Poll with a real chat request until it answers 200; note why if it never does."""
    body = b'{"model":"fake-model","messages":[{"role":"user","content":"ready?"}]}'
    headers = {"Content-Type": "application/json", **target.header_dict()}
    if target.auth:
        headers["Authorization"] = f"Bearer {target.auth}"
    if target.episodes:
        headers["X-Episode-Id"] = "bench-ready"
        headers["X-Episode-Budget"] = str(EPISODE_BUDGET)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if target.proc is not None and target.proc.poll() is not None:
            target.skip = f"exited with {target.proc.returncode}: {_tail(target.log_path)}"
            return False
        request = urllib.request.Request(target.chat_url, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                if resp.status == 200:
                    return True
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    target.skip = f"not ready after {timeout:.0f} s ({last}) {_tail(target.log_path)}"
    stop(target.proc)
    return False


# ---- the rows ------------------------------------------------------------------------------


def start_upstream(workdir: Path, chunks: int, gap_ms: float) -> Target:
    port = free_port()
    log = workdir / "upstream.log"
    argv = [
        sys.executable,
        "-m",
        "budgetproxy.testing.fake_upstream",
        "--port",
        str(port),
        "--chunks",
        str(chunks),
        "--chunk-gap-ms",
        str(gap_ms),
    ]
    target = Target(
        "direct", "the fake upstream itself (no proxy)", f"http://127.0.0.1:{port}/v1", log_path=log
    )
    target.proc = spawn(argv, log, core=CLIENT_CORE)
    if not wait_ready(target, 20):
        raise SystemExit(f"fake upstream did not start: {target.skip}")
    return target


def start_forwarder(
    workdir: Path, upstream: str, wrapper: list[str] | None = None, ready_timeout: float = 60.0
) -> Target:
    port = free_port()
    log = workdir / "forwarder.log"
    argv = [
        *(wrapper or []),
        sys.executable,
        str(BENCH_DIR / "minimal_forwarder.py"),
        "--upstream",
        upstream,
        "--port",
        str(port),
    ]
    target = Target(
        "forwarder",
        "minimal Starlette + aiohttp forwarder (baseline)",
        f"http://127.0.0.1:{port}/v1",
        log_path=log,
    )
    target.proc = spawn(argv, log)
    wait_ready(target, ready_timeout)
    return target


def budgetproxy_missing() -> str:
    """Why budgetproxy cannot be benchmarked yet, or "" when its command line exists."""
    if importlib.util.find_spec("budgetproxy") is None:
        return "budgetproxy is not importable (pip install -e .)"
    if importlib.util.find_spec("budgetproxy.cli") is None:
        return "budgetproxy has no cli module yet (`budgetproxy serve` not built)"
    return ""


# Budgets beside turns are set past anything a run spends, the cost budget at $100: about
# $0.0001 a call at the rows' prices, held $0.03 a call in flight. (A dollar amount, as users
# set one: at $1e9 the six decimals of X-Episode-Cost-Remaining alone cost 2.6x the
# instructions of $100's.)
# budgetproxy rows: name -> (description, requests carry episode ids, config YAML or None).
# The first two are the default rows; the others are ablations, run when named in --targets,
# to attribute the cost of episodes to its parts.
BUDGETPROXY_VARIANTS: dict[str, tuple[str, bool, str | None]] = {
    "budgetproxy": ("budgetproxy, forwarding only (no episode id)", False, None),
    "budgetproxy+episodes": (
        f"budgetproxy, {EPISODES} rotating episodes, disclosed arm",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n",
    ),
    "budgetproxy+redis": (
        f"budgetproxy, {EPISODES} rotating episodes, disclosed arm, Redis store",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "store: {kind: redis, url: 'redis://127.0.0.1:6379/0', key_prefix: bench}\n",
    ),
    "bp+episodes-axes": (
        f"budgetproxy, {EPISODES} rotating episodes, disclosed arm, token, cost and time "
        "budgets beside turns (none reached)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "budget: {default_tokens: 1000000000000, default_cost_usd: 100.0, "
        "default_time_s: 1000000000.0}\n"
        "prices: {'*': {input_per_mtok: 1.0, output_per_mtok: 2.0}}\n",
    ),
    "bp+episodes-tokens": (
        "ablation: episodes, disclosed, a token budget beside turns (never reached)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "budget: {default_tokens: 1000000000000}\n",
    ),
    "bp+episodes-cost": (
        "ablation: episodes, disclosed, a cost budget beside turns (never reached)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "budget: {default_cost_usd: 100.0}\n"
        "prices: {'*': {input_per_mtok: 1.0, output_per_mtok: 2.0}}\n",
    ),
    "bp+episodes-time": (
        "ablation: episodes, disclosed, a time budget beside turns (never reached)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "budget: {default_time_s: 1000000000.0}\n",
    ),
    "bp+episodes-capture": (
        "episodes, disclosed, token capture on (the upstream answers with vLLM's token ids "
        "and logprobs, which the proxy logs and strips from the client's answer)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "upstreams: [{name: default, base_url: '{upstream}', capture_tokens: true}]\n",
    ),
    "bp+episodes-tokenfields": (
        "ablation: episodes, disclosed, capture off, the client asking for token ids and "
        "logprobs itself (the capture row's answers, passed through: its baseline)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n",
    ),
    "bp+episodes-stream": (
        "episodes, disclosed, every call streamed (the upstream answers 4 content chunks)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n",
    ),
    "bp+episodes-aiohttp": (
        "ablation: episodes, disclosed, model calls sent upstream with aiohttp "
        "(upstreams[].http_client: aiohttp)",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "upstreams: [{name: default, base_url: '{upstream}', http_client: aiohttp}]\n",
    ),
    "bp+episodes-hidden": (
        "ablation: episodes, hidden arm (no rewrite)",
        True,
        "disclosure: {mode: hidden}\n",
    ),
    "bp+episodes-nolog": (
        "ablation: episodes, disclosed, trajectories off",
        True,
        "disclosure: {mode: disclosed}\ntrajectories: {enabled: false}\n",
    ),
    "bp+episodes-noturns": (
        "ablation: episodes, disclosed, no turn log for the trajectory API",
        True,
        "disclosure: {mode: disclosed, placement: last_message, history: keep}\n"
        "rollouts: {keep_turns: false}\n",
    ),
    "bp+episodes-bare": (
        "ablation: episodes, hidden, trajectories and metrics off",
        True,
        "disclosure: {mode: hidden}\ntrajectories: {enabled: false}\nmetrics: {enabled: false}\n",
    ),
    "bp-nometrics": (
        "ablation: forwarding only, metrics off",
        False,
        "metrics: {enabled: false}\n",
    ),
    "bp+episodes-unobserved": (
        "ablation: episodes, disclosed, trajectories on, metrics and tracing off",
        True,
        "disclosure: {mode: disclosed}\nmetrics: {enabled: false}\ntracing: {enabled: false}\n",
    ),
    "bp+episodes-traced-10pct": (
        "episodes, disclosed, metrics on, tracing on with 10% of traces sampled",
        True,
        "disclosure: {mode: disclosed}\ntracing: {enabled: true}\n",
    ),
    "bp+episodes-traced-unsampled": (
        "episodes, disclosed, metrics on, tracing on with no trace sampled (propagation only)",
        True,
        "disclosure: {mode: disclosed}\ntracing: {enabled: true}\n",
    ),
    "bp+episodes-traced": (
        "episodes, disclosed, metrics on, tracing on (OTLP/HTTP to a local sink)",
        True,
        "disclosure: {mode: disclosed}\ntracing: {enabled: true}\n",
    ),
}


def split_revision(name: str) -> tuple[str, str | None]:
    """A row name and the git revision after its "@" (``budgetproxy+episodes@main~3``), or
    None for the working tree: builds compared side by side in one run."""
    variant, at, rev = name.partition("@")
    return variant, (rev if at else None)


def is_budgetproxy_row(name: str) -> bool:
    variant, rev = split_revision(name)
    return variant in BUDGETPROXY_VARIANTS and rev != ""


def source_of(rev: str, workdir: Path) -> Path:
    """The package source at ``rev``, unpacked once per run under ``workdir``."""
    sha = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise SystemExit(f"unknown git revision {rev!r}: {sha.stderr.strip()}")
    dest = workdir / f"src-{sha.stdout.strip()[:12]}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(REPO_DIR), "archive", sha.stdout.strip(),
                                    "budgetproxy"], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {rev} failed")
    return dest


def start_budgetproxy(
    workdir: Path, upstream: str, name: str, wrapper: list[str] | None = None,
    ready_timeout: float = 60.0,
) -> Target:
    variant, rev = split_revision(name)
    description, episodes, extra = BUDGETPROXY_VARIANTS[variant]
    if rev is not None:
        description = f"{description} (at {rev})"
    port = free_port()
    target = Target(
        name, description, f"http://127.0.0.1:{port}/v1", episodes=EPISODES if episodes else 0
    )
    missing = budgetproxy_missing()
    if missing:
        target.skip = missing
        return target
    slug = name.replace("+", "-").replace("@", "-at-").replace("~", "-").replace("/", "-")
    target.log_path = workdir / f"{slug}.log"
    log_dir = workdir / f"trajectories-{slug}"
    argv = [sys.executable, "-m", "budgetproxy", "serve", "--port", str(port)]
    src = source_of(rev, workdir) if rev is not None else REPO_DIR
    # The fake upstream's X-Fake-* steering headers reach it only when named, at revisions
    # that forward request headers by name (earlier ones forward them all, and refuse the key).
    named = "forward_headers" in (src / "budgetproxy" / "config.py").read_text()
    if extra is not None or named:
        config = workdir / f"{slug}.yaml"
        # Written per CONTRACT.md's config schema; the upstream comes from --upstream.
        # Each row its own Redis keys, and each run: rows at other revisions must not share
        # episodes, nor a run meet the episodes an earlier one left ended (abandoned after
        # their idle timeout, so every call to them is refused).
        extra = (extra or "").replace("key_prefix: bench",
                                      f"key_prefix: bench-{slug}-{workdir.name}")
        if named:
            extra = f"server: {{forward_headers: [x-fake-*]}}\n{extra}"
        config.write_text(f"# bench/run.py: {description}\nbudget: {{default_turns: 20}}\n{extra}")
        argv += ["--config", str(config)]
    # --log-dir merges into the config's trajectories section (it keeps `enabled: false`).
    argv += ["--log-dir", str(log_dir)]
    if extra is None or "{upstream}" not in extra:  # else the config names its upstream
        argv += ["--upstream", upstream]
    else:
        config.write_text(config.read_text().replace("{upstream}", upstream))
    if variant in ("bp+episodes-capture", "bp+episodes-tokenfields"):
        target.headers = "X-Fake-Token-Server: vllm"  # what vLLM answers when asked for them
    if variant == "bp+episodes-tokenfields":
        target.body_fields = '"return_token_ids":true,"logprobs":true'
    if variant == "bp+episodes-stream":
        target.body_fields = '"stream":true'
    # The row's own source first on the path, and the server started from the run's temp dir:
    # `python -m` puts the working directory before PYTHONPATH, so a row at another revision
    # started from the repository would import the working tree's package instead.
    env: dict[str, str] | None = {"PYTHONPATH": str(src)}
    if variant.startswith("bp+episodes-traced"):
        # The fake upstream doubles as the OTLP/HTTP receiver (POST /v1/traces).
        env = (env or {}) | {"OTEL_EXPORTER_OTLP_ENDPOINT": upstream.rsplit("/v1", 1)[0],
                             "OTEL_SERVICE_NAME": "budgetproxy-bench"}
        if variant.endswith("-10pct"):
            env |= {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": "0.1"}
        elif variant.endswith("-unsampled"):
            env |= {"OTEL_TRACES_SAMPLER": "always_off"}
    target.proc = spawn([*(wrapper or []), *argv], target.log_path, env, cwd=workdir)
    wait_ready(target, ready_timeout)
    return target


_NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream fake {{ server 127.0.0.1:{port}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{listen} backlog=4096;
        location /v1/ {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(workdir: Path, upstream: str) -> Target:
    port = free_port()
    target = Target(
        "nginx",
        "nginx reverse proxy, one worker (the physical limit)",
        f"http://127.0.0.1:{port}/v1",
    )
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if nginx is None:
        target.skip = "nginx not installed (apt-get install nginx-light)"
        return target
    ngx_dir = workdir / "nginx"
    ngx_dir.mkdir()
    upstream_port = upstream.split(":")[-1].split("/")[0]
    conf = ngx_dir / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(dir=ngx_dir, port=upstream_port, listen=port))
    target.log_path = ngx_dir / "nginx-error.log"
    # -e (nginx >= 1.19.5) keeps it from opening the system error log before reading ours.
    argv = [nginx, "-p", str(ngx_dir), "-c", str(conf), "-e", str(target.log_path)]
    target.proc = spawn(argv, workdir / "nginx.out")
    wait_ready(target, 15)
    return target


def ensure_litellm_venv(create: bool) -> str:
    """Path of the litellm executable, creating its venv when asked; "" when unavailable."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return str(exe)
    if not create:
        return ""
    print(f"creating {LITELLM_VENV} with {LITELLM_SPEC} (slow, once)...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC], check=True)
    return str(exe) if exe.exists() else ""


def start_litellm(workdir: Path, upstream: str, create: bool) -> Target:
    port = free_port()
    key = "sk-bench-" + secrets.token_urlsafe(32)
    target = Target(
        "litellm",
        "LiteLLM proxy 1.106.12, one worker (the peer)",
        f"http://127.0.0.1:{port}/v1",
        auth=key,
        forwards_headers=False,
        warmup_s=4.0,  # it keeps importing modules during its first requests
        min_run_s_c256=8.0,  # ~14 ms CPU a request: 256 of them take >3 s to finish at all
    )
    exe = ensure_litellm_venv(create)
    if not exe:
        target.skip = "no LiteLLM venv (run once with --with-litellm to create it)"
        return target
    conf = workdir / "litellm.yaml"
    conf.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {upstream}\n"
        "      api_key: fake-key\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )
    target.log_path = workdir / "litellm.log"
    env = {
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "DISABLE_SCHEMA_UPDATE": "True",
    }
    argv = [
        exe,
        "--config",
        str(conf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    target.proc = spawn(argv, target.log_path, env=env)
    wait_ready(target, 180)
    return target


def portkey_version() -> str:
    pins = json.loads((PORTKEY_DIR / "package.json").read_text())["dependencies"]
    return str(pins["@portkey-ai/gateway"])


def ensure_portkey(create: bool) -> tuple[str, str]:
    """(node, the gateway's start script), installing the pinned gateway with npm when asked;
    ("", why) when unavailable."""
    node = shutil.which("node")
    if node is None:
        return "", "Node.js is not installed (apt-get install nodejs npm)"
    script = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    installed = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
    try:
        found = json.loads(installed.read_text()).get("version")
    except (OSError, ValueError):
        found = None
    if found == portkey_version() and script.exists():
        return node, str(script)
    if not create:
        return "", ("Portkey's gateway is not installed (run once with --with-portkey, "
                    f"or {PORTKEY_INSTALL})")
    npm = shutil.which("npm")
    if npm is None:
        return "", "npm is not installed (apt-get install npm)"
    print(f"installing @portkey-ai/gateway {portkey_version()} with npm...", flush=True)
    done = subprocess.run([npm, "ci", "--prefix", str(PORTKEY_DIR), "--no-audit", "--no-fund",
                           "--loglevel=error"], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not script.exists():
        return "", f"{PORTKEY_INSTALL} failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return node, str(script)


def start_portkey(workdir: Path, upstream: str, create: bool) -> Target:
    """Portkey's AI gateway (Node, one process: one core), routing every call to the fake
    upstream as an OpenAI custom host. A plain gateway: no budgets, no logs kept."""
    port = free_port()
    target = Target(
        "portkey",
        f"Portkey AI gateway {portkey_version()}, Node {_node_version()} (a peer)",
        f"http://127.0.0.1:{port}/v1",
        auth="fake-key",
        headers=f"x-portkey-provider: openai; x-portkey-custom-host: {upstream}",
        forwards_headers=False,
        warmup_s=2.0,  # the JIT warms up
    )
    node, script = ensure_portkey(create)
    if not node:
        target.skip = script
        return target
    target.log_path = workdir / "portkey.log"
    # NODE_ENV=production and --headless: no UI, no request log kept for it.
    target.proc = spawn([node, script, f"--port={port}", "--headless"], target.log_path,
                        env={"NODE_ENV": "production"})
    wait_ready(target, 60)
    return target


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "missing"
    done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip().lstrip("v") or "?"


def _process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (servers with worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants."""
    total = 0
    for current in _process_tree(pid):
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU time used so far by ``pid`` and all its descendants."""
    total = 0
    for current in _process_tree(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS
