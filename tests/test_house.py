"""The house rules (issue 33), read from the source with `ast` (pure: nothing is imported or run):

- no module over 800 lines, no function or method over 100;
- no import circle between modules (imports inside functions count, and so do `if TYPE_CHECKING:` imports: two
  modules that name each other are read together, and one runtime import makes the circle real);
- no private name (`_x`) imported from another package, nor reached as `module._x` (a sibling module in the same
  package is fine);
- imports point down the floors (FLOORS below; docs/dev/internals.md "The floors" says why each sits where it does).

Each test names every offender. `benchmarks/` has no figure for this: it is a count, and the count is zero.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100

# Lowest first. A module's floor is that of the longest prefix naming it; an import may go to its own floor (another
# package there included) or below, never above. The capabilities are floors of their own, in this order: each may
# import the pure parts (or, where one command does another's work, the entry point) of the ones before it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("gpuops", "gpuops.errors", "gpuops.console", "gpuops.paths", "gpuops.interrupts", "gpuops.notify",
                "gpuops.jsonvocab", "gpuops.knowledge", "gpuops.hostpool",
                "gpuops.history")),  # runs/metrics.sqlite: stdlib only, written by jobs/, read by the dashboard
    ("remote", ("gpuops.remote",)),
    ("profiles", ("gpuops.profiles",)),
    ("verify", ("gpuops.verify",)),
    ("transfer", ("gpuops.transfer",)),
    # what a project needs, read and resolved here (issue 34): setup, jobs and pipeline ask it; it asks none of them
    ("project", ("gpuops.project",)),
    ("setup", ("gpuops.setup",)),
    ("jobs", ("gpuops.jobs",)),
    # Slurm clusters (issue 41), beside the fleet as a way to reach many nodes: its pure parts (states, batch) use the
    # jobs' environment and command line and verify's judges; the sandbox's local cluster may use its formats
    ("slurm", ("gpuops.slurm",)),
    ("sandbox", ("gpuops.sandbox",)),
    ("cloud", ("gpuops.cloud",)),
    # what composes capabilities: `gpuops run`, the dashboard, and profiles new/pin (one connection, a probe, the
    # GPU table, the ledger's names, the price list: verify's, cloud's and remote's parts put together)
    ("composers", ("gpuops.pipeline", "gpuops.dashboard", "gpuops.profiles.write")),
    ("cli", ("gpuops.cli", "gpuops.__main__")),
]


# -- the reading (pure: a folder of sources in, facts out) ---------------------------------------------------------
@dataclass
class Import:
    source: str  # the importing module
    target: str  # the module imported (a submodule when the name imported is one)
    names: tuple[str, ...]  # names taken from target (empty for `import x` / a submodule)
    line: int
    type_only: bool


@dataclass
class Tree:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)
    private_uses: list[tuple[str, int, str, str]] = field(default_factory=list)  # (module, line, target, name)

    def rel(self, module: str) -> str:
        return str(self.modules[module].relative_to(self.root))


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def read(root: Path, package: str = "gpuops") -> Tree:
    tree = Tree(root)
    for path in sorted((root / package).rglob("*.py")):
        tree.modules[_module_name(path, root)] = path
    for module, path in tree.modules.items():
        is_pkg = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # a local name bound to one of our modules

        def absolute(name: str | None, level: int) -> str:
            if not level:
                return name or ""
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - (level - 1)]
            return ".".join(base + ([name] if name else []))

        def visit(node: ast.AST, type_only: bool) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.body:
                    visit(child, True)
                for child in node.orelse:
                    visit(child, type_only)
                return
            if isinstance(node, ast.ImportFrom):
                base = absolute(node.module, node.level)
                if base == package or base.startswith(package + "."):
                    plain = []
                    for alias in node.names:
                        sub = f"{base}.{alias.name}"
                        if sub in tree.modules:
                            tree.imports.append(Import(module, sub, (), node.lineno, type_only))
                            aliases[alias.asname or alias.name] = sub
                            if alias.name.startswith("_"):
                                tree.private_uses.append((module, node.lineno, base, alias.name))
                        else:
                            plain.append(alias.name)
                    if plain:
                        tree.imports.append(Import(module, base, tuple(plain), node.lineno, type_only))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        tree.imports.append(Import(module, alias.name, (), node.lineno, type_only))
                        if alias.asname:
                            aliases[alias.asname] = alias.name
            for child in ast.iter_child_nodes(node):
                visit(child, type_only)

        parsed = ast.parse(path.read_text(encoding="utf-8"), str(path))
        visit(parsed, False)
        for node in ast.walk(parsed):  # module._private, the other way to reach a private name
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                tree.private_uses.append((module, node.lineno, aliases[node.value.id], node.attr))
    return tree


def _package_of(tree: Tree, module: str) -> str:
    return module if tree.modules[module].name == "__init__.py" else module.rpartition(".")[0]


# -- the rules -----------------------------------------------------------------------------------------------------
def big_modules(tree: Tree, limit: int = MAX_MODULE_LINES) -> list[str]:
    found = []
    for module, path in tree.modules.items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            found.append(f"{tree.rel(module)}: {n} lines")
    return found


def long_functions(tree: Tree, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    found = []
    for module, path in tree.modules.items():
        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        n = child.end_lineno - child.lineno + 1
                        if n > limit:
                            found.append(f"{tree.rel(module)}:{child.lineno} {name}: {n} lines")
                    walk(child, name + ".")
                else:
                    walk(child, prefix)

        walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def graph(tree: Tree) -> dict[str, set[str]]:
    """Who imports whom: a module imports its target and every package above the target. Every import counts, those
    inside functions and those under `if TYPE_CHECKING:` too (issue 42: each of four circles went through one)."""
    edges: dict[str, set[str]] = {m: set() for m in tree.modules}
    for imp in tree.imports:
        parts = imp.target.split(".")
        for i in range(1, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in tree.modules and target != imp.source:
                edges[imp.source].add(target)
    return edges


def circles(tree: Tree) -> list[str]:
    """Every strongly connected set of modules (Tarjan), each shown as one circle through it."""
    edges = graph(tree)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    found = []
    for group in groups:
        members = set(group)
        path = [group[0]]  # walk inside the group back to its first module
        while True:
            nxt = sorted(edges[path[-1]] & members)
            back = group[0] if group[0] in nxt else next((w for w in nxt if w not in path), nxt[0])
            path.append(back)
            if back == group[0] or path.count(back) > 1:
                break
        found.append(" -> ".join(path) + (f" (and {', '.join(sorted(members - set(path)))})"
                                          if members - set(path) else ""))
    return found


def private_imports(tree: Tree) -> list[str]:
    found = []
    for module, line, target, name in tree.private_uses:
        if target in tree.modules and _package_of(tree, target) != _package_of(tree, module):
            found.append(f"{tree.rel(module)}:{line} takes {name} from {target}")
    for imp in tree.imports:
        for name in imp.names:
            if name.startswith("_") and not name.startswith("__") and imp.target in tree.modules \
                    and _package_of(tree, imp.target) != _package_of(tree, imp.source):
                found.append(f"{tree.rel(imp.source)}:{imp.line} takes {name} from {imp.target}")
    return sorted(set(found))


def floor_of(module: str, floors=FLOORS) -> int | None:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(floors):
        for p in prefixes:
            # the package `gpuops` itself names only its __init__: a new package must be given a floor of its own
            if (module == p or (p != "gpuops" and module.startswith(p + "."))) and len(p) > best:
                best, level = len(p), i
    return level


def unplaced(tree: Tree, floors=FLOORS) -> list[str]:
    return [f"{tree.rel(m)} ({m}) is on no floor" for m in tree.modules if floor_of(m, floors) is None]


def upward_imports(tree: Tree, floors=FLOORS) -> list[str]:
    found = set()
    for imp in tree.imports:
        if imp.type_only:
            continue
        a, b = floor_of(imp.source, floors), floor_of(imp.target, floors)
        if a is not None and b is not None and b > a:
            found.add(f"{tree.rel(imp.source)}:{imp.line} {imp.source} ({floors[a][0]}) -> {imp.target} "
                      f"({floors[b][0]})")
    return sorted(found)


# -- the house as built --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def house() -> Tree:
    return read(SRC)


def test_no_module_over_800_lines(house):
    found = big_modules(house)
    assert not found, "\n" + "\n".join(found)


def test_no_function_over_100_lines(house):
    found = long_functions(house)
    assert not found, "\n" + "\n".join(found)


def test_no_import_circle(house):
    found = circles(house)
    assert not found, "\n" + "\n".join(found)


def test_no_private_name_across_packages(house):
    found = private_imports(house)
    assert not found, "\n" + "\n".join(found)


def test_every_module_has_a_floor(house):
    found = unplaced(house)
    assert not found, "\n" + "\n".join(found)


def test_imports_point_down_the_floors(house):
    found = upward_imports(house)
    assert not found, "\n" + "\n".join(found)


# -- the checker catches what it is for (a small made-up package) ---------------------------------------------------
def test_the_checker_names_each_kind_of_offender(tmp_path):
    pkg = tmp_path / "gpuops"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "low/__init__.py": "",
        "low/a.py": "from ..high import b\nX = 1\n",
        "low/c.py": "from . import d\n\ndef f():\n    from .d import _h\n    return d._g\n",
        "low/d.py": "def _g():\n    pass\n\ndef _h():\n    pass\n",
        "low/e.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .f import F\n",  # an annotation's
        "low/f.py": "from .e import G\nF = 1\n",  # import closes a circle too
        "high/__init__.py": "",
        "high/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..cli import main\n"
                      "def g():\n    from ..low.a import X\n    from ..low.d import _g\n    from ..low import d\n"
                      "    return d._h\n"),
        "cli/__init__.py": "",
        "cli/main.py": "def run():\n" + "    x = 1\n" * 100 + "\n" * 700,
        "stray.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    floors = [("ground", ("gpuops.errors", "gpuops")), ("low", ("gpuops.low",)), ("high", ("gpuops.high",)),
              ("cli", ("gpuops.cli",))]
    tree = read(tmp_path)
    assert big_modules(tree) == ["gpuops/cli/main.py: 801 lines"]
    assert long_functions(tree) == ["gpuops/cli/main.py:1 run: 101 lines"]
    assert sorted(circles(tree)) == ["gpuops.high.b -> gpuops.low.a -> gpuops.high.b",
                                     "gpuops.low.e -> gpuops.low.f -> gpuops.low.e"]
    assert private_imports(tree) == ["gpuops/high/b.py:6 takes _g from gpuops.low.d",
                                     "gpuops/high/b.py:8 takes _h from gpuops.low.d"]
    assert upward_imports(tree, floors) == ["gpuops/low/a.py:1 gpuops.low.a (low) -> gpuops.high.b (high)"]
    assert unplaced(tree, floors) == ["gpuops/stray.py (gpuops.stray) is on no floor"]  # `gpuops` is no catch-all
    assert unplaced(tree, floors[1:]) == ["gpuops/__init__.py (gpuops) is on no floor",
                                          "gpuops/errors.py (gpuops.errors) is on no floor",
                                          "gpuops/stray.py (gpuops.stray) is on no floor"]
