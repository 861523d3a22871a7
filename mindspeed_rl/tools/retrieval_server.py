"""An HTTP retrieval service in the shape upstream MindSpeed-RL's search tool calls
(``retrieval_service_url``, the Search-R1 retriever protocol), over the BM25 index of
``retrieval.py``.

Request: ``POST /retrieve`` with ``{"queries": [str, ...], "topk": int | null, "return_scores":
bool}``. Response: ``{"result": [[hit, ...] per query]}``, where a hit is ``{"document": {"id":
str, "contents": str}, "score": float}`` with ``return_scores`` true (what the search tool sends)
and the bare ``{"id", "contents"}`` document without. A bad request is answered 400 with
``{"detail": why}``.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mindspeed_rl.tools.retrieval import BM25Index

MAX_REQUEST_BYTES = 1024 * 1024
MAX_QUERIES = 1024


def answer(request: Any, index: BM25Index, default_topk: int) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, body)`` for one decoded request body."""
    if not isinstance(request, dict):
        return 400, {"detail": 'the request needs a JSON object {"queries": [...], "topk": k}'}
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        return 400, {"detail": '"queries" must be a list of strings'}
    if len(queries) > MAX_QUERIES:
        return 400, {"detail": f"{len(queries)} queries in one request; send at most {MAX_QUERIES}"}
    topk = request.get("topk")
    if topk is None:
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        return 400, {"detail": f'"topk" must be a positive integer, got {topk!r}'}
    with_scores = bool(request.get("return_scores", False))
    result: list[list[Any]] = []
    for hits in index.search(queries, topk):
        documents = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
        if with_scores:
            result.append([{"document": d, "score": h.score} for d, h in zip(documents, hits, strict=True)])
        else:
            result.append(documents)
    return 200, {"result": result}


def make_server(host: str, port: int, index: BM25Index, *, default_topk: int = 3) -> ThreadingHTTPServer:
    """A bound server (``port`` 0 = any free port); call ``serve_forever`` to run it."""
    if default_topk < 1:
        raise ValueError(f"default topk={default_topk}; use 1 or more")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/retrieve":
                self._send(404, {"detail": f"no endpoint {self.path}; use /retrieve"})
                return
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_REQUEST_BYTES:
                self._send(413, {"detail": f"request over {MAX_REQUEST_BYTES} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except json.JSONDecodeError as exc:
                self._send(400, {"detail": f"request is not JSON: {exc.msg}"})
                return
            self._send(*answer(body, index, default_topk))

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the run's log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
