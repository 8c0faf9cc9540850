"""The package's layers (docs/contributing.md, "Package layout"), checked on the source.

Every module of ``attnlens/`` is parsed with :mod:`ast` (nothing is imported), and every
import of an ``attnlens`` module is collected, at module level and inside functions:

- no import cycle among modules, counting every import that runs: at module level and
  inside functions (a local import that closes a circle is the circle put off, not gone),
  but not those under ``if TYPE_CHECKING:``, which never run;
- no upward import: in the order models, data, io, rows, analysis, figures, report, cli,
  each module may import only from its own layer and those listed before it (io may not
  import figures). The top-level base modules (``errors``, ``settings``, ``progress``)
  import nothing of the layers and every layer may import them; ``attnlens/__init__.py``
  (the public API) imports the layers up to report and is itself imported by cli
  (``__version__``); ``__main__`` runs cli.

An import names the module it reads from: ``from attnlens.io import results`` is an import
of ``attnlens.io.results``, and ``from attnlens.io.results import Result`` one of
``attnlens.io.results`` alone: the parent packages Python initialises on the way are not
counted, or a package that re-exports its modules would always be in a circle with them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlens"
LAYERS = ("models", "data", "io", "rows", "analysis", "figures", "forecast", "report", "cli")
BASE = ("attnlens.errors", "attnlens.settings", "attnlens.progress")
# Deliberate exceptions: none today. An entry is (importer, imported) with a comment that says why.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    local: bool  # inside a function: runs when the function is called
    typing_only: bool  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        where = "local import" if self.local else "import"
        return f"{self.importer} ({where}, line {self.line}) -> {self.imported}"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``attnlens/io/results.py`` -> ``attnlens.io.results``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


class _Collector(ast.NodeVisitor):
    """The ``attnlens`` imports of one module, each with whether it is local and whether it is for typing only."""

    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.known = module, known
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = self.typing = 0
        self.found: list[Import] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            self.visit(test)
            self.typing += 1
            for child in node.body:
                self.visit(child)
            self.typing -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # relative: from the package, one level up per extra dot
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            self._add(submodule if submodule in self.known else source, node)

    def _add(self, imported: str, node: ast.stmt) -> None:
        if imported == "attnlens" or imported.startswith("attnlens."):
            self.found.append(Import(self.module, imported, node.lineno, self.depth > 0, self.typing > 0))


def imports(root: Path = PACKAGE) -> list[Import]:
    """Every import of an ``attnlens`` module by a module of ``root``, in the order of the files."""
    found = modules(root)
    known = set(found)
    collected = []
    for module, path in found.items():
        collector = _Collector(module, path.name == "__init__.py", known)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        collected += collector.found
    return collected


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (or of one that imports itself), sorted."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the graph is small enough to recurse
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(components)


def rank(module: str) -> float:
    """Where a module stands in the order of layers: a module may import those of its own rank and lower."""
    if module in BASE:
        return -1
    if module == "attnlens":  # the public API: every layer but cli, which reads its __version__
        return LAYERS.index("cli") - 0.5
    if module == "attnlens.__main__":  # `python -m attnlens`: runs cli
        return len(LAYERS)
    layer = module.split(".")[1]
    assert layer in LAYERS, f"{module} is in no layer: add it to LAYERS or BASE in {Path(__file__).name}"
    return LAYERS.index(layer)


def upward(edges: list[Import]) -> list[Import]:
    """The upward imports: of a module of a layer listed after the importer's (in LAYERS, or as :func:`rank` places it)."""
    return [
        edge
        for edge in edges
        if rank(edge.imported) > rank(edge.importer) and (edge.importer, edge.imported) not in ALLOWED_UPWARD
    ]


def test_every_module_has_a_layer():
    for module in modules():
        rank(module)


def test_no_import_cycle():
    found = imports()
    running = [edge for edge in found if not edge.typing_only]
    problems = []
    for component in cycles(running):
        inside = dict.fromkeys(str(edge) for edge in running if edge.importer in component and edge.imported in component)
        problems.append("import cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(inside))
    assert not problems, "\n".join(problems)


def test_no_upward_import():
    problems = list(dict.fromkeys(str(edge) for edge in upward(imports())))
    assert not problems, "imports of a higher layer (see docs/contributing.md, Package layout):\n    " + "\n    ".join(problems)


def test_the_checks_find_a_cycle_and_an_upward_import(tmp_path):
    """The checks themselves, on a small package with one circle (a -> b -> a, b's import local) and one upward import."""
    root = tmp_path / "attnlens"
    (root / "io").mkdir(parents=True)
    (root / "figures").mkdir()
    for path in (root / "__init__.py", root / "io" / "__init__.py", root / "figures" / "__init__.py", root / "errors.py"):
        path.write_text("")
    (root / "io" / "a.py").write_text("from attnlens.io.b import thing\nfrom attnlens.errors import BadInput\n")
    (root / "io" / "b.py").write_text("def thing():\n    from . import a\n    from attnlens.figures import style\n")
    (root / "figures" / "style.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..io import a\n")
    found = imports(root)
    assert {(edge.importer, edge.imported, edge.local, edge.typing_only) for edge in found} == {
        ("attnlens.io.a", "attnlens.io.b", False, False),
        ("attnlens.io.a", "attnlens.errors", False, False),
        ("attnlens.io.b", "attnlens.io.a", True, False),
        ("attnlens.io.b", "attnlens.figures.style", True, False),
        ("attnlens.figures.style", "attnlens.io.a", False, True),
    }
    assert cycles([edge for edge in found if not edge.typing_only]) == [["attnlens.io.a", "attnlens.io.b"]]
    assert [(edge.importer, edge.imported) for edge in upward(found)] == [("attnlens.io.b", "attnlens.figures.style")]
