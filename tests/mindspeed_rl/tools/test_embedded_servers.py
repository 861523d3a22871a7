"""A run's embedded servers: started (real ``cli/*_server.py`` processes) when a tool config's URL
is local and nothing listens there, answering the tools, and gone once the run's context ends.
The CLI wiring is checked by the multi-turn fault run (tests/.../test_multi_turn_faults_e2e.py)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.tools.config import ToolEntry
from mindspeed_rl.tools.embedded_servers import (
    EmbeddedServerError,
    embedded_servers,
    listening,
    local_servers,
)
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import network_namespace_available
from mindspeed_rl.tools.search_tool import SearchTool

CODE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query_list": {"type": "array"}},
            "required": ["query_list"],
        },
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def code_entry(url: str, **config: Any) -> ToolEntry:
    return ToolEntry("mindspeed_rl.tools.retool.ReTool", {"sandbox_fusion_url": url, **config}, CODE_SCHEMA)


def search_entry(url: str, name: str = "search", **config: Any) -> ToolEntry:
    schema = {**SEARCH_SCHEMA, "function": {**SEARCH_SCHEMA["function"], "name": name}}
    return ToolEntry(
        "mindspeed_rl.tools.search_tool.SearchTool", {"retrieval_service_url": url, **config}, schema
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); the context reaps what it started, so none should be left.
    return Path(f"/proc/{pid}").exists()


# --- what a tool config asks for ---------------------------------------------------------------


def test_only_local_urls_are_planned_and_shared_ports_take_the_widest_limits() -> None:
    plans = local_servers(
        [
            code_entry("http://sandbox.example.com:8080/run_code"),
            code_entry("http://127.0.0.1:9001/run_code", default_timeout=5, num_workers=2),
            search_entry("http://localhost:9002/retrieve", corpus_path="c.jsonl", topk=2),
            search_entry("http://localhost:9002/retrieve", name="search2", topk=5),
        ]
    )
    sandbox, retrieval = plans
    assert (sandbox.kind, sandbox.port) == ("sandbox", 9001)
    assert sandbox.args() == [
        "--workers", "2", "--max-timeout-s", "5", "--max-memory-mb", "1024", "--max-output-bytes", "65536",
    ]  # fmt: skip
    assert retrieval.tools == ("search", "search2")
    assert retrieval.args() == ["--corpus", "c.jsonl", "--topk", "5"]


def test_a_local_url_the_embedded_server_cannot_serve_is_refused() -> None:
    with pytest.raises(EmbeddedServerError, match="serves /run_code"):
        local_servers([code_entry("http://127.0.0.1:9001/execute")])
    with pytest.raises(EmbeddedServerError, match="give each its own port"):
        local_servers(
            [code_entry("http://127.0.0.1:9001/run_code"), search_entry("http://127.0.0.1:9001/retrieve")]
        )


# --- the lifecycle -----------------------------------------------------------------------------


def test_the_retrieval_server_is_started_answers_and_stops(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Nile"\nA river of Africa.'}) + "\n")
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    entry = search_entry(url, corpus_path=str(corpus), topk=1)
    with embedded_servers([entry], tmp_path / "servers") as started:
        (server,) = started
        assert server.kind == "retrieval" and alive(server.pid)
        result = SearchTool(entry.config, entry.tool_schema).execute({"query_list": ["river"]})
        assert result.ok and 'Doc 1 (Title: "Nile")' in json.loads(result.text)["result"]
    assert not alive(server.pid)
    assert not listening("127.0.0.1", int(url.split(":")[2].split("/")[0]))
    assert "retrieval server on" in server.log.read_text()


def test_the_sandbox_server_is_started_answers_and_stops(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/run_code"
    # isolate_network false where the OS has no user namespaces; the tool then asks the server
    # to run without one (--allow-network), as a user has to.
    entry = code_entry(
        url, default_timeout=10, memory_limit_mb=512, isolate_network=network_namespace_available()
    )
    with embedded_servers([entry], tmp_path / "servers") as started:
        (server,) = started
        tool = ReTool(entry.config, entry.tool_schema)
        result = tool.execute({"code": f"import os\nos.getpid() != {os.getpid()}"})
        assert result.ok and result.text.strip() == "True"
    assert not alive(server.pid)


def test_a_server_already_listening_is_used_not_started(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
        # No corpus_path: starting one would be refused, so an empty list proves nothing was tried.
        with embedded_servers([search_entry(url)], tmp_path / "servers") as started:
            assert started == []


def test_a_local_retriever_with_nothing_listening_and_no_corpus_is_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    servers = embedded_servers([search_entry(url)], tmp_path / "servers")
    with pytest.raises(EmbeddedServerError, match="set corpus_path in the tool config"), servers:
        pass


def test_a_server_that_cannot_start_fails_with_its_own_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    servers = embedded_servers(
        [search_entry(url, corpus_path=str(tmp_path / "missing.jsonl"))], tmp_path / "s"
    )
    with pytest.raises(EmbeddedServerError, match="is not a file"), servers:
        pass
