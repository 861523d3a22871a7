"""The search tool against the real retrieval server: ``cli/retrieval_server.py`` started as its
own process over a small corpus (BM25 by ``bm25s``), requests in the protocol upstream's search
tool speaks, and ``SearchTool`` built from a tool YAML in upstream's shape."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.tools import search_tool
from mindspeed_rl.tools.config import build_tools, read_tool_config
from mindspeed_rl.tools.retrieval import BM25Index, Passage, read_corpus
from mindspeed_rl.tools.search_tool import SearchTool

ROOT = Path(__file__).resolve().parents[3]
CORPUS = [
    {
        "id": "everest",
        "contents": '"Mount Everest"\nThe highest mountain on Earth, on the border of Nepal and China.',
    },
    {
        "id": "nile",
        "contents": '"Nile"\nA river of north-eastern Africa that flows into the Mediterranean Sea.',
    },
    {
        "id": "curie",
        "title": "Marie Curie",
        "text": "A physicist and chemist who discovered polonium and radium.",
    },
    {
        "id": "python",
        "contents": '"Python"\nA programming language released in 1991 with a large standard library.',
    },
]
SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query_list": {"type": "array", "item": {"type": "string"}}},
            "required": ["query_list"],
        },
    },
}


def _upstream_yaml(url: str) -> str:
    """A tool YAML in upstream's search_tool_config.yaml shape (its keys, its schema, ``item``
    spelled as upstream spells it), only the URL changed."""
    return (
        "tools:\n"
        '  - class_name: "mindspeed_rl.tools.search_tool.SearchTool"\n'
        "    config:\n"
        f'      retrieval_service_url: "{url}"\n'
        "      num_workers: 120\n"
        "      enable_global_rate_limit: true\n"
        "      rate_limit: 120\n"
        "      timeout: 30\n"
        "      topk: 3\n"
        "      type: native\n"
        "    tool_schema:\n"
        '      type: "function"\n'
        "      function:\n"
        '        name: "search"\n'
        '        description: "Searches the web for relevant information based on the given query."\n'
        "        parameters:\n"
        '          type: "object"\n'
        "          properties:\n"
        "            query_list:\n"
        '              type: "array"\n'
        "              item:\n"
        '                type: "string"\n'
        '              description: "A list of fully-formed semantic queries."\n'
        '          required: ["query_list"]\n'
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("search") / "corpus.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in CORPUS))
    return path


@pytest.fixture(scope="module")
def server_url(corpus: Path) -> Iterator[str]:
    args = [sys.executable, str(ROOT / "cli" / "retrieval_server.py"), "--corpus", str(corpus), "--port", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("retrieval server on "), (line, proc.stderr.read() if proc.stderr else "")
        yield line.split(" on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read()))


# --- the index ---------------------------------------------------------------------------------


def test_bm25_ranks_the_passage_sharing_the_query_terms_first(corpus: Path) -> None:
    index = BM25Index.from_jsonl(corpus)
    (hits,) = index.search(["which river flows into the Mediterranean"], k=2)
    assert hits[0].passage.id == "nile" and hits[0].score > 0
    # Only passages sharing a term are returned, however large k is.
    assert len(hits) == 1


def test_a_query_with_no_known_word_finds_nothing_and_k_is_clamped(corpus: Path) -> None:
    index = BM25Index.from_jsonl(corpus)
    empty, found = index.search(["zzz qqq", "mountain river language physicist"], k=50)
    assert empty == [] and {h.passage.id for h in found} == {"everest", "nile", "python", "curie"}
    with pytest.raises(ValueError, match="topk=0"):
        index.search(["nile"], k=0)


def test_title_and_text_lines_become_contents(corpus: Path) -> None:
    curie = next(p for p in read_corpus(corpus) if p.id == "curie")
    assert curie == Passage(
        id="curie", contents="Marie Curie\nA physicist and chemist who discovered polonium and radium."
    )


def test_a_bad_corpus_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"contents": "a"}\n{"id": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: needs a 'contents' string"):
        read_corpus(bad)
    with pytest.raises(ValueError, match="is not a file"):
        read_corpus(tmp_path / "missing.jsonl")


# --- the server's protocol ---------------------------------------------------------------------


def test_the_server_answers_the_search_r1_shape(server_url: str) -> None:
    status, body = post(
        server_url, {"queries": ["Mount Everest height", "polonium"], "topk": 3, "return_scores": True}
    )
    assert status == 200
    everest, curie = body["result"]
    assert everest[0]["document"] == {"id": "everest", "contents": CORPUS[0]["contents"]}
    assert isinstance(everest[0]["score"], float) and everest[0]["score"] > 0
    assert curie[0]["document"]["id"] == "curie"
    # Without scores, bare documents (what Search-R1's server answers then).
    status, body = post(server_url, {"queries": ["polonium"], "topk": 1, "return_scores": False})
    assert status == 200 and body["result"] == [
        [{"id": "curie", "contents": "Marie Curie\n" + CORPUS[2]["text"]}]
    ]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"queries": "nile"}, "list of strings"),
        ({"queries": ["nile"], "topk": 0}, "positive integer"),
        ([1, 2], "JSON object"),
    ],
)
def test_a_bad_request_is_answered_400_with_the_reason(server_url: str, body: Any, why: str) -> None:
    status, answer = post(server_url, body)
    assert status == 400 and why in answer["detail"]


# --- the tool ----------------------------------------------------------------------------------


def test_upstreams_tool_yaml_builds_our_search_tool_and_it_searches(server_url: str, tmp_path: Path) -> None:
    path = tmp_path / "search_tool_config.yaml"
    path.write_text(_upstream_yaml(server_url))
    tools = build_tools(read_tool_config(path))
    tool = tools["search"]
    assert isinstance(tool, SearchTool)
    result = tool.execute({"query_list": ["highest mountain", "programming language 1991"]})
    assert result.ok
    text = json.loads(result.text)["result"]
    first, second = text.split("\n---\n")
    assert first.startswith('Doc 1 (Title: "Mount Everest")\nThe highest mountain on Earth')
    assert second.startswith('Doc 1 (Title: "Python")\nA programming language released in 1991')


def test_no_hit_and_bad_arguments_are_answers_the_model_reads(server_url: str) -> None:
    tool = SearchTool({"retrieval_service_url": server_url, "topk": 2}, SCHEMA)
    nothing = tool.execute({"query_list": ["zzz qqq"]})
    assert nothing.ok and json.loads(nothing.text) == {"result": "No search results found."}
    for arguments in ({}, {"query_list": "nile"}, {"query_list": []}, {"query_list": [3]}):
        bad = tool.execute(arguments)
        assert not bad.ok and json.loads(bad.text)["result"].startswith("Error: "), arguments


def test_a_retriever_that_does_not_answer_is_a_search_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_tool, "RETRY_DELAYS_S", (0.0,))
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tool = SearchTool({"retrieval_service_url": f"http://127.0.0.1:{port}/retrieve", "timeout": 2}, SCHEMA)
    result = tool.execute({"query_list": ["nile"]})
    assert not result.ok and "Search error: the retriever at" in json.loads(result.text)["result"]


def test_bad_tool_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="needs retrieval_service_url"):
        SearchTool({"retrieval_service_url": ""}, SCHEMA)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['topn'\]"):
        SearchTool({"retrieval_service_url": "http://x/retrieve", "topn": 3}, SCHEMA)


def test_the_shipped_search_config_builds_and_its_corpus_loads() -> None:
    (entry,) = read_tool_config(ROOT / "configs" / "tools" / "search_tool_config.yaml")
    assert isinstance(build_tools((entry,))["search"], SearchTool)
    index = BM25Index.from_jsonl(ROOT / str(entry.config["corpus_path"]))
    (hits,) = index.search(["highest mountain above sea level"], k=3)
    assert "Mount Everest" in hits[0].passage.contents
