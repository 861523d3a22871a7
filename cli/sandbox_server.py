"""Serve the local code sandbox over SandboxFusion's HTTP ``run_code`` API.

    python cli/sandbox_server.py --host 127.0.0.1 --port 8080

Then point a tool config's ``sandbox_fusion_url`` at ``http://127.0.0.1:8080/run_code``: the
model's code runs in this server's child processes (limits and threat model:
docs/guides/multi-turn-tools.md), not in any trainer or generation actor. Refuses to start where
it cannot isolate the network, unless ``--allow-network``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.tools.sandbox_server import ServerLimits, make_server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=4, help="code runs at once")
    parser.add_argument("--max-timeout-s", type=float, default=60.0, help="cap on a request's run_timeout")
    parser.add_argument("--max-memory-mb", type=int, default=2048, help="cap on a request's memory_limit_MB")
    parser.add_argument("--max-output-bytes", type=int, default=64 * 1024)
    parser.add_argument(
        "--allow-network", action="store_true", help="run code without a network namespace of its own"
    )
    args = parser.parse_args(argv)
    limits = ServerLimits(
        max_timeout_s=args.max_timeout_s,
        max_memory_mb=args.max_memory_mb,
        max_output_bytes=args.max_output_bytes,
        workers=args.workers,
        isolate_network=not args.allow_network,
    )
    try:
        server = make_server(args.host, args.port, limits)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"sandbox server on http://{host}:{port}/run_code", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
