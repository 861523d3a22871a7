"""`make check-stacks`: does each stack of mindspeed_rl/_pins.py resolve for its Python and
platforms? Asks pip's resolver (dry runs against the registry, nothing installed), prints a table
and writes the answers as JSON (stacks/resolved.json by default).

    python tools/check_stacks.py                  # every stack, every platform
    python tools/check_stacks.py --stack ascend-trainer --jobs 1
    python tools/check_stacks.py --write          # render stacks/*.txt from _pins.py

Exit status 1 when a stack file is not current or a target does not resolve (the table names
the conflict). What pip cannot fetch from here (other indexes, git and source builds, sdist-only
packages) is offered as a stand-in with its declared requirements (tools/stack_resolver.py); the
table lists which stand-ins each answer used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.stack_files import RECORD, ROOT, load_pins, rendered, stale_files, targets
from tools.stack_resolver import GLIBC_MINOR, Resolution, resolve, stand_in_name


def table(results: Sequence[Resolution]) -> str:
    """One row per target: stack, platform, python, resolved, packages, and the conflict (or the
    stand-ins the answer rests on)."""
    rows = [("stack", "platform", "python", "resolved", "packages", "conflict / stand-ins used")]
    for r in results:
        t = r.target
        if r.resolved:
            detail = ", ".join(r.stand_ins) if r.stand_ins else "-"
            rows.append((t.stack, t.platform, t.python, "yes", str(len(r.versions)), detail))
        else:
            rows.append((t.stack, t.platform, t.python, "NO", "-", r.conflict or "?"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        lines.append("  ".join([*cells, row[5]]).rstrip())
    return "\n".join(lines)


def record(results: Sequence[Resolution], pins: dict) -> dict:
    """The JSON written: when, with which pip, each answer, and where each stand-in came from."""
    used = sorted({spec for r in results for spec in r.stand_ins})
    return {
        "checked": dt.date.today().isoformat(),
        "pip": importlib.metadata.version("pip"),
        "glibc": f"2.{GLIBC_MINOR}",
        "how": "pip install --dry-run --report --ignore-installed --only-binary=:all: per target (tools/check_stacks.py)",
        "stand_ins": {spec: pins["STAND_INS"][spec] for spec in used},
        "results": [r.as_json() for r in results],
    }


def merged(old: dict, new: dict) -> dict:
    """``new``'s answers over ``old``'s, per (stack, platform, python)."""

    def key(result: dict) -> tuple[str, str, str]:
        return result["stack"], result["platform"], result["python"]

    answers = {key(r): r for r in old.get("results", [])} | {key(r): r for r in new["results"]}
    stand_ins = {**old.get("stand_ins", {}), **new["stand_ins"]}
    used = {spec for r in answers.values() for spec in r["stand_ins"]}
    return {
        **new,
        "stand_ins": {s: stand_ins[s] for s in sorted(used) if s in stand_ins},
        "results": list(answers.values()),
    }


def write_files(pins: dict) -> list[Path]:
    written = []
    for path, text in rendered(pins).items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="render stacks/*.txt from _pins.py and stop")
    parser.add_argument("--stack", action="append", help="only this stack (repeatable)")
    parser.add_argument("--jobs", type=int, default=2, help="dry runs at once (default 2)")
    parser.add_argument(
        "--json",
        type=Path,
        default=RECORD,
        help=f"where to write the answers (default {RECORD.relative_to(ROOT)})",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per dry run")
    parser.add_argument(
        "--with-stack-indexes",
        action="store_true",
        help="also pass each stack's --extra-index-url (where PyTorch's and Ascend's indexes are reachable)",
    )
    args = parser.parse_args(argv)
    pins = load_pins()
    if args.write:
        for path in write_files(pins):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    stale = stale_files(pins)
    if stale:
        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        print(
            f"stack files not current with mindspeed_rl/_pins.py: {names}; run `python tools/check_stacks.py --write`"
        )
        return 1
    chosen = [t for t in targets(pins["STACKS"]) if not args.stack or t.stack in args.stack]
    if args.stack and {t.stack for t in chosen} != set(args.stack):
        print(f"unknown stack in {args.stack}; known: {', '.join(pins['STACKS'])}")
        return 2
    for spec in pins["STAND_INS"]:
        stand_in_name(spec)  # a malformed entry fails here, before minutes of dry runs
    print(f"asking pip's resolver about {len(chosen)} targets ({args.jobs} at a time) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="check-stacks-") as tmp:

        def one(index: int) -> Resolution:
            target = chosen[index]
            workdir = Path(tmp) / f"{index}-{target.stack}-{target.platform}"
            result = resolve(
                target,
                pins["STACKS"][target.stack],
                pins["STAND_INS"],
                workdir,
                timeout=args.timeout,
                with_stack_indexes=args.with_stack_indexes,
            )
            state = "resolved" if result.resolved else "NOT resolved"
            print(
                f"  {target.stack} {target.platform} py{target.python}: {state} ({result.seconds:.0f} s)",
                flush=True,
            )
            return result

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(one, range(len(chosen))))
    print()
    print(table(results))
    answers = record(results, pins)
    if args.stack and args.json.exists():  # a partial run updates its targets, keeps the others
        answers = merged(json.loads(args.json.read_text()), answers)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(answers, indent=1) + "\n")
    print(f"\nwritten: {args.json}")
    return 0 if all(r.resolved for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
