"""The house's layering, read from the source of every module in envs/, agents/, algos/ and
benchmarks/: no import circles (imports inside functions count too; those under
``if TYPE_CHECKING:`` never run and do not), dependencies flow one way (benchmarks -> algos
-> agents -> envs), and inside algos/ the floors by folder: the engine below the method, the
recipes above it, imported only by the commands, the top floor that nothing below imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("envs", "agents", "algos", "benchmarks")
RANK = {name: rank for rank, name in enumerate(PACKAGES)}
"""A module may import its own package and the ones before it in this order, never after."""

ENGINE = "algos.engine"
"""How one update runs: of algos it imports only itself and :data:`ENGINE_MAY_IMPORT`."""
ENGINE_MAY_IMPORT = ("algos.losses", "algos.batch")
"""The method's numerics, the one floor below which the engine sits."""
RECIPES = "algos.recipes"
COMMANDS = "algos.commands"
"""What the command line runs: the only floor outside :data:`RECIPES` that imports a recipe."""


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file for every module of the four packages (a package is its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file. ``from pkg import sub`` is an
    import of the module ``pkg.sub`` when it is one (and of ``pkg`` otherwise); the package
    ``__init__`` that Python runs on the way is not counted, or every package that imports
    its own submodules would be a circle. ``importlib.import_module("pkg.mod")`` with a
    literal name is an import too: a hand-over by name is still an arrow."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        literal = _import_module_literal(node)
        if literal is not None:
            parts = literal.split(".")
            named = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
            out.update(next(([m] for m in named if m in modules), []))
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[:len(package) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                if full in modules:
                    out.add(full)
                elif base in modules:
                    out.add(base)
    out.discard(name)
    return out


def _import_module_literal(node: ast.AST) -> str | None:
    """The module name of an ``import_module("...")`` call (``importlib.import_module`` or the
    bare name) whose first argument is a string literal; None for anything else."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    arg = node.args[0]
    if called != "import_module" or not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
        return None
    return arg.value


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (imports for the type
    checker only, never run)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = project_modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_walker_sees_every_kind_of_import(tmp_path):
    """On a made-up tree: plain, from, relative and function-level imports are edges, a
    circle through a function-level import is found, a package importing its own submodule
    is not a circle, an import under ``if TYPE_CHECKING:`` is no edge, and
    ``importlib.import_module`` of a literal name is one."""
    files = {
        "envs/__init__.py": "from envs.core import step\n",
        "envs/core.py": "from envs import util\n",
        "envs/util.py": "def f():\n    from .core import step\n",
        "envs/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from envs import core\n",
        "envs/byname.py": "import importlib\ndef f(m):\n    importlib.import_module('agents.a').g()\n"
                          "    return importlib.import_module(m)\n",
        "agents/__init__.py": "",
        "agents/a.py": "import envs.util\nfrom envs import core\n",
        "algos/__init__.py": "",
        "benchmarks/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = import_graph(tmp_path)
    assert g["envs"] == {"envs.core"}
    assert g["envs.core"] == {"envs.util"}
    assert g["envs.util"] == {"envs.core"}
    assert g["agents.a"] == {"envs.util", "envs.core"}
    assert g["envs.typed"] == set()  # for the type checker only
    assert g["envs.byname"] == {"agents.a"}  # a literal name is an arrow; a name in a variable is not seen
    assert circles(g) == [["envs.core", "envs.util"]]


def test_no_import_circles(graph):
    found = circles(graph)
    assert found == [], "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{a} imports {sorted(set(graph[a]) & set(c))}" for a in c)
        for c in found)


def test_dependencies_flow_one_way(graph):
    upward = sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
                    if RANK[dep.split(".")[0]] > RANK[name.split(".")[0]])
    assert upward == []


def _in(name: str, folder: str) -> bool:
    return name == folder or name.startswith(folder + ".")


def _code_of(path: Path) -> str:
    """A module's code without its docstrings (a field's too) and comments: documentation
    may name a recipe, code may not."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                                 and isinstance(n.value.value, str))] or [ast.Pass()]
    return ast.unparse(tree)


def learner(graph: dict[str, set[str]]) -> set[str]:
    """The learner, read from the graph: every algos module the Trainer and SFT import,
    directly or not."""
    seen: set[str] = set()
    todo = ["algos.trainer", "algos.sft"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(d for d in graph[name] if d.startswith("algos."))
    return seen


def recipe_importers(graph: dict[str, set[str]]) -> list[str]:
    """The arrows into a recipe from outside the recipes and the commands."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
                  if _in(dep, RECIPES) and not _in(name, RECIPES) and not _in(name, COMMANDS))


def command_importers(graph: dict[str, set[str]]) -> list[str]:
    """The arrows into the commands, algos' top floor, from the algos modules below it (only
    ``python -m algos``, ``algos/__main__.py``, and the benchmarks above algos may import them)."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
                  if _in(dep, COMMANDS) and _in(name, "algos") and not _in(name, COMMANDS)
                  and name != "algos.__main__")


def engine_escapes(graph: dict[str, set[str]]) -> list[str]:
    """The arrows from the engine to algos modules other than its own and the numerics."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() if _in(name, ENGINE) for dep in deps
                  if dep.startswith("algos.") and not _in(dep, ENGINE) and dep not in ENGINE_MAY_IMPORT)


def test_the_floor_rules_see_a_planted_violation():
    planted = {"algos.trainer": {"algos.recipes.micro"}, "algos.commands.train": {"algos.recipes.micro"},
               "algos.recipes.micro": {"algos.recipes"}, "algos.engine.update": {"algos.losses", "algos.roles"}}
    assert recipe_importers(planted) == ["algos.trainer -> algos.recipes.micro"]
    planted["algos.recipes.micro.control"] = {"algos.commands.presets"}
    assert command_importers(planted) == ["algos.recipes.micro.control -> algos.commands.presets"]
    assert engine_escapes(planted) == ["algos.engine.update -> algos.roles"]


def test_only_the_commands_import_a_recipe(graph):
    assert any(_in(dep, RECIPES) for name, deps in graph.items() if _in(name, COMMANDS) for dep in deps)
    assert recipe_importers(graph) == []


def test_nothing_below_the_commands_imports_them(graph):
    assert any(_in(dep, COMMANDS) for deps in graph.values() for dep in deps)
    assert command_importers(graph) == []


def test_the_engine_imports_only_the_numerics_and_names_no_recipe(graph):
    engine = sorted(name for name in graph if _in(name, ENGINE))
    assert len(engine) >= 3, engine
    assert engine_escapes(graph) == []
    modules = project_modules()
    for name in engine:
        assert "micro" not in _code_of(modules[name]).lower(), name


def test_the_learner_imports_no_recipe_and_names_none(graph):
    modules = project_modules()
    found = learner(graph)
    assert {"algos.trainer", "algos.engine.update", "algos.losses", "algos.roles"} <= found
    for name in sorted(found):
        recipe = sorted(d for d in graph[name] if _in(d, RECIPES))
        assert recipe == [], f"{name} imports {recipe}"
        assert "micro" not in _code_of(modules[name]).lower(), name


def test_importing_the_learner_loads_no_recipe():
    """Not even through the modules it imports (the walk above sees direct imports only)."""
    import subprocess
    import sys

    code = ("import sys, algos.trainer, algos.sft; "
            "print(sorted(m for m in sys.modules if m.startswith('algos.recipes')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_old_module_name_imports_the_moved_module_itself():
    """``algos.MOVED``: a name users import (``algos.pipeline``, ``algos.checkpoint``, ...) is
    the module under its new name, the same object, with no file left of the old name."""
    import importlib

    from algos import MOVED

    modules = project_modules()
    for old, new in MOVED.items():
        assert old not in modules and new in modules, old
        module = importlib.import_module(old)
        assert module is importlib.import_module(new) and module.__spec__.name == new, old
