"""Serve a BM25 retriever over a local corpus in the protocol of upstream's search tool.

    python cli/retrieval_server.py --corpus examples/search/corpus.jsonl --host 127.0.0.1 --port 8000

Then point a search tool config's ``retrieval_service_url`` at ``http://127.0.0.1:8000/retrieve``.
The corpus is JSON lines with ``id`` and ``contents`` (title on the first line), as Search-R1's
corpora are; protocol and limits: docs/guides/multi-turn-tools.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.tools.retrieval import BM25Index
from mindspeed_rl.tools.retrieval_server import make_server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", required=True, help="JSON-lines corpus (id, contents)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request names none")
    args = parser.parse_args(argv)
    try:
        index = BM25Index.from_jsonl(args.corpus)
        server = make_server(args.host, args.port, index, default_topk=args.topk)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"retrieval server on http://{host}:{port}/retrieve ({len(index.passages)} passages)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
