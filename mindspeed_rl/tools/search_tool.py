"""``mindspeed_rl.tools.search_tool.SearchTool``: the class path upstream's
``configs/tools/search_tool_config.yaml`` names (MindSpeed-RL master, commit e5b482f).

It posts the ``query_list`` argument to ``retrieval_service_url`` in the Search-R1 retriever
protocol upstream speaks (``{"queries", "topk", "return_scores": true}`` ->
``{"result": [[{"document": {"contents"}, "score"}, ...] per query]}``) and answers the model with
the text upstream's tool gives it, so a policy trained against one reads the other the same: a
JSON object ``{"result": ...}`` whose text lists ``Doc i (Title: <first line>)`` and the passage
per hit, one block per query separated by ``---``.

Config keys are upstream's (``retrieval_service_url``, ``topk``, ``timeout``, ``num_workers``,
``enable_global_rate_limit``, ``rate_limit``, ``type``) plus this framework's ``corpus_path``: the
JSON-lines corpus the run's embedded BM25 server loads when the URL is local and nothing answers
there (``mindspeed_rl/tools/embedded_servers.py``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from mindspeed_rl.tools.base import ToolResult, argument_error

_KEYS = frozenset(
    {
        "retrieval_service_url",
        "topk",
        "timeout",
        "num_workers",
        "enable_global_rate_limit",
        "rate_limit",
        "type",
        "corpus_path",
    }
)
# A retriever restarting or briefly overloaded answers 5xx or refuses the connection; a few quick
# retries ride that out, while a dead one costs a call at most about RETRY_DELAYS_S in total
# (upstream retries ten times with growing delays, which a trajectory cannot afford).
RETRY_DELAYS_S = (0.5, 1.0)
_RETRIED_STATUS = frozenset({500, 502, 503, 504})


class SearchError(Exception):
    """The retrieval service did not answer usefully (the message says why)."""


class SearchTool:
    def __init__(self, config: Mapping[str, Any], tool_schema: Mapping[str, Any]) -> None:
        unknown = sorted(set(config) - _KEYS)
        if unknown:
            raise ValueError(f"search tool config: unknown key(s) {unknown}; valid keys: {sorted(_KEYS)}")
        url = config.get("retrieval_service_url")
        if not isinstance(url, str) or not url.strip():
            raise ValueError(
                "search tool config needs retrieval_service_url, the retriever's /retrieve endpoint "
                "(e.g. http://127.0.0.1:8000/retrieve; cli/retrieval_server.py serves one over a local corpus)"
            )
        self._url = url
        self._schema = dict(tool_schema)
        self._topk = int(config.get("topk", 3))
        self._timeout_s = float(config.get("timeout", 30))
        if self._topk < 1 or self._timeout_s <= 0:
            raise ValueError(
                f"search tool config: topk={self._topk}, timeout={self._timeout_s:g}; use topk >= 1 and timeout > 0"
            )
        workers = int(config.get("num_workers", 120))
        if config.get("enable_global_rate_limit", True):
            workers = min(workers, int(config.get("rate_limit", workers)))
        if workers < 1:
            raise ValueError(
                f"search tool: num_workers / rate_limit give {workers} concurrent requests; use 1 or more"
            )
        self._slots = threading.BoundedSemaphore(workers)

    @property
    def name(self) -> str:
        return str(self._schema.get("function", {}).get("name", "search"))

    @property
    def schema(self) -> Mapping[str, Any]:
        return self._schema

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        problem = argument_error(self._schema, arguments)
        if problem is not None:
            return ToolResult(_result(f"Error: {problem}"), ok=False)
        queries = arguments.get("query_list")
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            return ToolResult(
                _result("Error: 'query_list' must be a non-empty list of query strings"), ok=False
            )
        try:
            with self._slots:
                per_query = self._retrieve(queries)
        except SearchError as exc:
            return ToolResult(_result(f"Search error: {exc}"), ok=False)
        blocks = [_passages_text(hits) for hits in per_query]
        if not any(blocks):
            return ToolResult(_result("No search results found."))
        return ToolResult(_result("\n---\n".join(blocks)))

    def _retrieve(self, queries: Sequence[str]) -> list[list[Mapping[str, Any]]]:
        body = json.dumps({"queries": list(queries), "topk": self._topk, "return_scores": True}).encode()
        last = ""
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            if attempt:
                time.sleep(RETRY_DELAYS_S[attempt - 1])
            request = urllib.request.Request(
                self._url, data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    payload = json.loads(response.read().decode())
            except urllib.error.HTTPError as exc:
                last = f"the retriever at {self._url} answered HTTP {exc.code} ({_detail(exc)})"
                if exc.code in _RETRIED_STATUS:
                    continue
                raise SearchError(last) from exc
            except (urllib.error.URLError, OSError) as exc:
                # Connection refused or reset, or the timeout: the retriever may be restarting.
                last = f"the retriever at {self._url} did not answer ({exc})"
                continue
            except ValueError as exc:
                raise SearchError(
                    f"the retriever at {self._url} answered something that is not JSON ({exc})"
                ) from exc
            return _hits_per_query(payload, len(queries), self._url)
        raise SearchError(last)


def _hits_per_query(payload: Any, n_queries: int, url: str) -> list[list[Mapping[str, Any]]]:
    result = payload.get("result") if isinstance(payload, dict) else None
    if (
        not isinstance(result, list)
        or len(result) != n_queries
        or not all(isinstance(r, list) for r in result)
    ):
        raise SearchError(f"the retriever at {url} did not answer {{'result': [one list per query]}}")
    return result


def _passages_text(hits: Sequence[Any]) -> str:
    """One query's hits as the model reads them: ``Doc i (Title: ...)`` then the passage."""
    lines = []
    for rank, hit in enumerate(hits, start=1):
        document = hit.get("document", hit) if isinstance(hit, dict) else {}
        contents = str(document.get("contents", "")) if isinstance(document, dict) else ""
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {rank} (Title: {title})\n{text}")
    return "\n\n".join(lines)


def _result(text: str) -> str:
    return json.dumps({"result": text})


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read().decode() or "null")
    except (ValueError, OSError):
        return error.reason if isinstance(error.reason, str) else "no detail"
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)
