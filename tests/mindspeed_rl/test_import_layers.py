"""The package's layers: which sub-package may import which (module-level, lazy and TYPE_CHECKING
imports alike), so a climb back up fails here naming the edge instead of growing a cycle.

    runtime      (pure control logic: imports nothing else of the package)
    config_cls   (the typed schema)           ─► runtime
    weights      (weight-format library)      ─► utils
    models       (engines, losses, rewards)   ─► weights, datasets, utils, runtime
    tools        (tool calls, sandbox, agent loop) ─► models
    contracts    (specs the workers receive)  ─► models
    plan         (the one reader of the config) ─► config_cls, contracts, models, runtime, utils, ...
    workers      (Ray actors: TU, GU, CU)     ─► everything above except plan and trainer
    trainer      (start-up and the two loops) ─► anything
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mindspeed_rl"

# Sub-package -> sub-packages it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "runtime": frozenset(
        {
            "config_cls",
            "contracts",
            "datasets",
            "models",
            "plan",
            "sim",
            "tools",
            "trainer",
            "utils",
            "weights",
            "workers",
        }
    ),
    "config_cls": frozenset({"contracts", "models", "plan", "sim", "tools", "trainer", "weights", "workers"}),
    "models": frozenset({"contracts", "plan", "sim", "tools", "trainer", "workers"}),
    "tools": frozenset({"config_cls", "contracts", "plan", "sim", "trainer", "weights", "workers"}),
    "weights": frozenset({"contracts", "models", "plan", "sim", "tools", "trainer", "workers"}),
    "contracts": frozenset({"config_cls", "plan", "sim", "trainer", "weights", "workers"}),
    "datasets": frozenset({"plan", "trainer", "workers"}),
    "utils": frozenset({"plan", "trainer", "workers"}),
    "plan": frozenset({"sim", "trainer", "workers"}),
    "workers": frozenset({"plan", "trainer"}),
    "sim": frozenset({"plan", "trainer", "workers"}),
}


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "mindspeed_rl" else None


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    name = _module_name(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                module = ".".join(anchor + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            # ``from mindspeed_rl import trainer`` names the sub-package in the alias.
            if module == "mindspeed_rl":
                out += [(node.lineno, f"mindspeed_rl.{alias.name}") for alias in node.names]
    return out


def layer_violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _subpackage(_module_name(path))
        if here is None:
            continue
        forbidden = FORBIDDEN.get(here, frozenset())
        for line, module in _imports(path):
            there = _subpackage(module)
            if there is not None and there in forbidden:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} -> {module}")
    return found


def test_no_package_imports_a_layer_above_it() -> None:
    assert layer_violations() == []


def test_every_subpackage_has_a_rule() -> None:
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    subpackages |= {p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("_")}
    assert subpackages - set(FORBIDDEN) <= {"trainer"}, "a new sub-package needs its row in FORBIDDEN"


def test_the_walk_sees_lazy_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check must fail on an import buried in a function body (how the old cycle hid)."""
    fake = tmp_path / "mindspeed_rl"
    (fake / "runtime").mkdir(parents=True)
    (fake / "runtime" / "bad.py").write_text("def f():\n    from mindspeed_rl.trainer import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert layer_violations() == ["mindspeed_rl/runtime/bad.py:2: runtime -> mindspeed_rl.trainer"]


def module_cycles(subpackage: str) -> list[list[str]]:
    """Import cycles among the modules of ``subpackage`` (every import counted, lazy ones too):
    each strongly connected component of more than one module, sorted."""
    root = PACKAGE / subpackage
    modules = {_module_name(p): p for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        targets = [module for _, module in _imports(path)]
        # ``from a.b import c`` may import module a.b.c: count the submodule where there is one.
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets += [f"{node.module}.{alias.name}" for alias in node.names]
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                edges[name].add(".".join(parts))
    # Tarjan's strongly connected components (recursive: a few dozen modules).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycle_among_the_weights_modules() -> None:
    assert module_cycles("weights") == []


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle closed by an import inside a function (how the transports' cycle hid) fails."""
    fake = tmp_path / "mindspeed_rl" / "weights"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("from mindspeed_rl.weights.b import x\n")
    (fake / "b.py").write_text("def f():\n    from mindspeed_rl.weights import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "mindspeed_rl")
    assert module_cycles("weights") == [["mindspeed_rl.weights.a", "mindspeed_rl.weights.b"]]
