"""Print the exact pins (``name==version``) a requirements file gives the named packages, one per
line, for ``pip install --target`` of a CPU-checkable part of a stack (``make test-trainer-stack``).

    python stacks/pins_of.py stacks/ascend-trainer.txt transformers tokenizers huggingface-hub numpy

Exit 2 naming a package the file does not pin exactly (``==``): the check needs the set's version.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#,]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins_of(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            out[canonical(match.group(1))] = f"{match.group(1)}=={match.group(2)}"
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path, names = Path(argv[0]), argv[1:]
    if not path.is_file():
        print(f"error: {path} is missing (make check-stacks writes and resolves it)", file=sys.stderr)
        return 2
    pins = pins_of(path.read_text())
    missing = [n for n in names if canonical(n) not in pins]
    if missing:
        print(f"error: {path} pins no exact version of {', '.join(missing)}", file=sys.stderr)
        return 2
    print("\n".join(pins[canonical(n)] for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
