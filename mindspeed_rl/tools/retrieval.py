"""A BM25 retriever over a local corpus (``bm25s``), for the search tool's tests and demos.

The corpus is a JSON-lines file in the shape Search-R1's wiki corpus uses, which upstream
MindSpeed-RL's retrieval service serves: one object per line with ``id`` and ``contents`` (the
title on the first line, the passage after it). Lines with ``title`` and ``text`` instead are
accepted too (``contents`` is built as ``title\\ntext``).

Production users run a retriever of their own (dense or BM25 over a real corpus) and point
``retrieval_service_url`` at it; this one exists so the protocol, the tool and a run can be
exercised on a laptop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    contents: str


@dataclass(frozen=True, slots=True)
class Hit:
    passage: Passage
    score: float


def read_corpus(path: str | Path) -> list[Passage]:
    """The passages of a JSON-lines corpus; a clear error naming the line for a bad one."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"retrieval corpus {str(path)!r} is not a file; point it at a JSON-lines corpus")
    passages: list[Passage] = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            passages.append(_passage(item, f"{path}:{number}", default_id=str(len(passages))))
    if not passages:
        raise ValueError(f"{path}: the corpus has no passages")
    return passages


def _passage(item: Any, where: str, *, default_id: str) -> Passage:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: each line must be a JSON object with 'contents' (or 'title' and 'text')")
    if isinstance(item.get("contents"), str):
        contents = item["contents"]
    elif isinstance(item.get("title"), str) and isinstance(item.get("text"), str):
        contents = f"{item['title']}\n{item['text']}"
    else:
        raise ValueError(f"{where}: needs a 'contents' string, or 'title' and 'text' strings")
    return Passage(id=str(item.get("id", default_id)), contents=contents)


class BM25Index:
    """BM25 (``bm25s``'s Lucene variant, English stop words removed) over ``passages``."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        if not passages:
            raise ValueError("a BM25 index needs at least one passage")
        self.passages = list(passages)
        self._retriever = bm25s.BM25()
        tokens = bm25s.tokenize([p.contents for p in self.passages], stopwords="en", show_progress=False)
        self._retriever.index(tokens, show_progress=False)
        self._vocab = set(self._retriever.vocab_dict)
        # bm25s keeps no per-call state, but its retrieve path is not documented as thread-safe;
        # the HTTP server answers requests on threads.
        self._lock = threading.Lock()

    @classmethod
    def from_jsonl(cls, path: str | Path) -> BM25Index:
        return cls(read_corpus(path))

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The ``k`` best passages of each query, best first; passages sharing no term with the
        query (score 0) are left out, so a query with no known word gets an empty list."""
        if k < 1:
            raise ValueError(f"topk={k}; ask for 1 or more passages")
        k = min(k, len(self.passages))
        results: list[list[Hit]] = [[] for _ in queries]
        tokenized = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        # bm25s refuses a query none of whose words is in the vocabulary: answer those empty.
        known = [(i, [t for t in words if t in self._vocab]) for i, words in enumerate(tokenized)]
        known = [(i, words) for i, words in known if words]
        if not known:
            return results
        with self._lock:
            ids, scores = self._retriever.retrieve(
                [words for _, words in known], k=k, show_progress=False, n_threads=0
            )
        for row, (i, _) in enumerate(known):
            for doc, score in zip(
                np.asarray(ids[row]).tolist(), np.asarray(scores[row]).tolist(), strict=True
            ):
                if score > 0:
                    results[i].append(Hit(passage=self.passages[int(doc)], score=float(score)))
        return results
