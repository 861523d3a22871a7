"""Run pip with environment markers evaluated for another machine: ``python tools/pip_for_target.py
'<marker environment as JSON>' install --dry-run ...``.

pip's ``--platform`` / ``--python-version`` choose which wheels match, but pip evaluates every
``; platform_machine == ...`` / ``python_version ...`` marker (ours and the dependencies') against
the interpreter running it (pip 26.3, ``InstallRequirement.match_markers`` ->
``Marker.evaluate``, which starts from ``packaging.markers.default_environment()``). So an
aarch64 or Python 3.12 answer computed on this x86_64 Python 3.11 would drop or add the wrong
conditional dependencies. This wrapper replaces pip's vendored ``default_environment`` with the
target's before pip starts; nothing else of pip changes.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = json.loads(argv[0])
    import pip._vendor.packaging.markers as markers  # pip's own copy, patched below

    environment = {**markers.default_environment(), **target}
    markers.default_environment = lambda: dict(environment)  # type: ignore[assignment,return-value]
    from pip._internal.cli.main import main as pip_main

    return pip_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
