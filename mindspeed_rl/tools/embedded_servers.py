"""Start the embedded sandbox / retrieval server a run's tool config points at, when it is local
and nothing answers there, and stop it with the run.

A tool config's ``sandbox_fusion_url`` (code tools) or ``retrieval_service_url`` (search tool)
that names this host (``localhost``, ``127.0.0.1``, ``::1``) with a port nobody listens on gets
``cli/sandbox_server.py`` or ``cli/retrieval_server.py`` started on that port by the driver,
before Ray and the actors; a URL somewhere else, or a local port that already answers, is used as
it is. The server runs in a process of its own (never in a trainer or actor process), in its own
session, and receives SIGTERM if the driver dies without stopping it (Linux).

Local means the driver's host: generation actors on other nodes cannot reach it, so a multi-node
run points the URL at a server every node can reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from mindspeed_rl.tools.config import ToolEntry

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
"""How long a started server may take to listen (the BM25 server indexes its corpus first)."""
STOP_TIMEOUT_S = 10.0

Kind = Literal["sandbox", "retrieval"]
_URL_KEY: dict[Kind, str] = {"sandbox": "sandbox_fusion_url", "retrieval": "retrieval_service_url"}
_PATH: dict[Kind, str] = {"sandbox": "/run_code", "retrieval": "/retrieve"}
_SCRIPT: dict[Kind, str] = {"sandbox": "cli/sandbox_server.py", "retrieval": "cli/retrieval_server.py"}


class EmbeddedServerError(RuntimeError):
    """A local server the tool config needs could not be started (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """One server a tool config points at on this host: where, and what it would be started with
    if nothing answers there."""

    kind: Kind
    url: str
    host: str
    port: int
    tools: tuple[str, ...]
    caps: Mapping[str, float]
    """Numeric CLI options (``--workers``, ``--max-timeout-s``, ... or ``--topk``)."""
    allow_network: bool = False
    corpus: str | None = None

    def args(self) -> list[str]:
        numbers = [x for key, value in self.caps.items() for x in (key, _number(value))]
        extra = ["--allow-network"] if self.allow_network else []
        corpus = ["--corpus", self.corpus] if self.corpus else []
        return [*corpus, *numbers, *extra]

    def joined(self, other: ServerPlan) -> ServerPlan:
        """Shared by several tools: started with the widest of their limits."""
        caps = {key: max(value, other.caps.get(key, value)) for key, value in self.caps.items()}
        return replace(
            self,
            tools=(*self.tools, *other.tools),
            caps=caps,
            allow_network=self.allow_network or other.allow_network,
            corpus=self.corpus or other.corpus,
        )


@dataclass(frozen=True, slots=True)
class StartedServer:
    kind: Kind
    url: str
    pid: int
    log: Path


def is_local_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def local_servers(entries: Sequence[ToolEntry]) -> list[ServerPlan]:
    """The servers on this host that ``entries`` point at, one per (host, port)."""
    plans: dict[tuple[str, int], ServerPlan] = {}
    for entry in entries:
        for kind, key in _URL_KEY.items():
            url = entry.config.get(key)
            if not isinstance(url, str) or not url:
                continue
            parts = urlsplit(url)
            host = parts.hostname or ""
            if not is_local_host(host):
                continue
            port = parts.port or (443 if parts.scheme == "https" else 80)
            if parts.path.rstrip("/") != _PATH[kind]:
                raise EmbeddedServerError(
                    f"tool {entry.name!r}: {key}={url!r} is local, and the embedded {kind} server serves "
                    f"{_PATH[kind]}; use http://{host}:{port}{_PATH[kind]} or a server of your own"
                )
            plan = _plan(kind, url, host, port, entry)
            known = plans.get((host, port))
            if known is not None and known.kind != kind:
                raise EmbeddedServerError(
                    f"tools {known.tools[0]!r} and {entry.name!r} point a {known.kind} and a {kind} server at "
                    f"{host}:{port}; give each its own port"
                )
            plans[(host, port)] = plan if known is None else known.joined(plan)
    return list(plans.values())


def _plan(kind: Kind, url: str, host: str, port: int, entry: ToolEntry) -> ServerPlan:
    """The server's CLI caps from the tool config: the tool sends its own per-request limits,
    which the server caps, so these are the tool's own and nothing it asks for is cut."""
    config = entry.config
    workers = int(config.get("num_workers", 4 if kind == "sandbox" else 120))
    if config.get("enable_global_rate_limit", kind == "retrieval"):
        workers = min(workers, int(config.get("rate_limit", workers)))
    if kind == "retrieval":
        corpus = config.get("corpus_path")
        return ServerPlan(
            kind=kind, url=url, host=host, port=port, tools=(entry.name,),
            caps={"--topk": int(config.get("topk", 3))},
            corpus=corpus if isinstance(corpus, str) and corpus else None,
        )  # fmt: skip
    caps = {
        "--workers": max(1, workers),
        "--max-timeout-s": float(config.get("default_timeout", 30)),
        "--max-memory-mb": int(config.get("memory_limit_mb", 1024)),
        "--max-output-bytes": int(config.get("max_output_bytes", 64 * 1024)),
    }
    return ServerPlan(
        kind=kind, url=url, host=host, port=port, tools=(entry.name,), caps=caps,
        allow_network=not config.get("isolate_network", True),
    )  # fmt: skip


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the driver dies without stopping it (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def start_server(plan: ServerPlan, log_dir: Path) -> tuple[StartedServer, subprocess.Popen[bytes]]:
    """Start ``plan``'s server on its port and wait until it listens."""
    if plan.kind == "retrieval" and plan.corpus is None:
        raise EmbeddedServerError(
            f"nothing answers at {plan.url} (tool {plan.tools[0]!r}); start your retriever there, or set "
            "corpus_path in the tool config (a JSON-lines corpus) so the run starts the embedded BM25 server"
        )
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{plan.kind}_server_{plan.port}.log"
    cmd = [
        sys.executable,
        str(ROOT / _SCRIPT[plan.kind]),
        "--host",
        plan.host,
        "--port",
        str(plan.port),
        *plan.args(),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=os.getcwd(),  # relative corpus paths are the user's, as for tool_config_path
            start_new_session=True,  # Ctrl-C in the terminal goes to the run, which then stops it
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not listening(plan.host, plan.port, timeout_s=0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            tail = log.read_text(errors="replace").strip()[-2000:]
            # The server's own advice names its CLI flag; a run's user sets the tool config key.
            hint = (
                "; in a tool config, isolate_network: false is --allow-network"
                if "--allow-network" in tail
                else ""
            )
            raise EmbeddedServerError(
                f"the embedded {plan.kind} server for {plan.url} did not start ({tail or 'no output'}){hint}; "
                f"command: {' '.join(cmd)}"
            )
        time.sleep(0.1)
    return StartedServer(kind=plan.kind, url=plan.url, pid=proc.pid, log=log), proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        proc.wait()  # reap it (it may have died mid-run)


@contextlib.contextmanager
def embedded_servers(entries: Sequence[ToolEntry], log_dir: Path) -> Iterator[list[StartedServer]]:
    """Start what ``entries`` need on this host and nothing answers yet; stop them on exit."""
    started: list[tuple[StartedServer, subprocess.Popen[bytes]]] = []
    try:
        for plan in local_servers(entries):
            if listening(plan.host, plan.port):
                logger.info(
                    "tools %s: using the %s server already at %s", list(plan.tools), plan.kind, plan.url
                )
                continue
            server, proc = start_server(plan, log_dir)
            started.append((server, proc))
            logger.info(
                "tools %s: started the embedded %s server at %s (pid %d, log %s); it stops with the run",
                list(plan.tools), plan.kind, plan.url, server.pid, server.log,
            )  # fmt: skip
        yield [s for s, _ in started]
    finally:
        for server, proc in reversed(started):
            exited = proc.poll()
            _stop(proc)
            if exited is None:
                logger.info("stopped the embedded %s server at %s", server.kind, server.url)
            else:
                logger.warning(
                    "the embedded %s server at %s had exited during the run (code %s); log %s",
                    server.kind, server.url, exited, server.log,
                )  # fmt: skip
