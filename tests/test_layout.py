"""The shape of the code: no import cycles in pipeline/ + schedules/, no private names across modules.

Read with `ast` (nothing is imported): every `import` / `from ... import`, at module level or
inside a function, is an edge of the graph (those under `if TYPE_CHECKING:` never run: not
edges). Importing a.b.c also runs the packages a and a.b, unless the importer is inside them. A name starting with one underscore is private to its
module: another module may not import it (`from m import _x`) nor reach it (`m._x`); tests use
the public API too. A module whose own name starts with an underscore is private to its package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPH_PACKAGES = ("pipeline", "schedules")
# packages whose modules may not reach into others' private names
CHECKED_PACKAGES = GRAPH_PACKAGES + ("tests",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in CHECKED_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "web_runtime" in path.parts or "node_modules" in path.parts:
                continue
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(importer: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    package = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _private_module_reach(importer: str, target: str) -> bool:
    """True when `target` is (inside) a private module that `importer` may not reach."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])  # the package the private module belongs to
            return not (importer == owner or importer.startswith(owner + "."))
    return False


class _Imports(ast.NodeVisitor):
    """Edges to internal modules and cross-module private names of one module."""

    def __init__(self, name: str):
        self.name = name
        self.edges: set[str] = set()
        self.private: set[str] = set()
        self.aliases: dict[str, str] = {}  # local name -> internal module it is bound to
        self.type_checking = False  # inside `if TYPE_CHECKING:`

    def _edge(self, target: str, lineno: int) -> None:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if not target or target == self.name:
            return
        if _private_module_reach(self.name, target):
            self.private.add(f"{self.name}:{lineno} imports private module {target}")
        if self.type_checking:
            return
        self.edges.add(target)
        # importing a.b.c runs the __init__ of a.b and a unless the importer is already inside them
        parent = target.rpartition(".")[0]
        while parent and not (self.name == parent or self.name.startswith(parent + ".")):
            self.edges.add(parent)
            parent = parent.rpartition(".")[0]

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self.type_checking = True
        for child in node.body:
            self.visit(child)
        self.type_checking = False
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in CHECKED_PACKAGES:
                continue
            self._edge(alias.name, node.lineno)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.name, node.module, node.level)
        if base.split(".")[0] not in CHECKED_PACKAGES:
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in MODULES:
                self._edge(full, node.lineno)
                self.aliases[alias.asname or alias.name] = full
            else:
                self._edge(base, node.lineno)
                if _private(alias.name) and alias.name != "*":
                    self.private.add(f"{self.name}:{node.lineno} imports {base}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = []
        inner: ast.AST = node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in self.aliases:
            chain.reverse()
            module = self.aliases[inner.id]
            # walk down submodules, stop at the first attribute that is a name of a module
            for i, attr in enumerate(chain):
                if f"{module}.{attr}" in MODULES:
                    module = f"{module}.{attr}"
                    continue
                if _private(attr) and module != self.name:
                    self.private.add(f"{self.name}:{node.lineno} uses {module}.{attr}")
                break
            return  # the chain was handled whole; don't visit its inner attributes again
        self.generic_visit(node)


def _scan() -> dict[str, _Imports]:
    scans = {}
    for name, path in MODULES.items():
        visitor = _Imports(name)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        scans[name] = visitor
    return scans


SCANS = _scan()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> str:
    """One concrete cycle inside a component, for the failure message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return " -> ".join(paths[v] + [start])
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return ", ".join(component)


def _scan_source(name: str, source: str) -> _Imports:
    visitor = _Imports(name)
    visitor.visit(ast.parse(source))
    return visitor


def test_the_scanner_finds_edges_cycles_and_private_names():
    assert "pipeline.build" in MODULES and "schedules" in MODULES
    assert "pipeline.artifact" in SCANS["pipeline.build"].edges
    scan = _scan_source("pipeline.tune", (
        "from .passes.pipeline import PHASES, _hidden\n"
        "from .profiler import measure\n"
        "import pipeline.backends.cuda as cuda\n"
        "def f():\n"
        "    from .weights import convert_weights\n"
        "    return measure._secret, cuda.PTXAS_CACHE, measure.__name__\n"
        "if TYPE_CHECKING:\n"
        "    from .build import build\n"
    ))
    # the package pipeline.passes runs too; pipeline itself holds the importer
    assert {"pipeline.passes.pipeline", "pipeline.passes", "pipeline.profiler.measure", "pipeline.weights",
            "pipeline.backends.cuda"} <= scan.edges
    assert "pipeline.build" not in scan.edges and "pipeline" not in scan.edges
    assert {line.split(" ", 1)[1] for line in scan.private} == {
        "imports pipeline.passes.pipeline._hidden", "uses pipeline.profiler.measure._secret"}
    outsider = _scan_source("tests.test_x", "from pipeline.profiler.reports._common import ROLES\n")
    assert [line.split(" ", 1)[1] for line in outsider.private] == ["imports private module pipeline.profiler.reports._common"]
    insider = _scan_source("pipeline.profiler.reports.html", "from ._common import ROLES\n")
    assert not insider.private
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = {
        name: {t for t in scan.edges if t.split(".")[0] in GRAPH_PACKAGES}
        for name, scan in SCANS.items()
        if name.split(".")[0] in GRAPH_PACKAGES
    }
    cycles = [_cycle_path(graph, c) for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_names_across_modules():
    offenders = sorted(line for scan in SCANS.values() for line in scan.private)
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


def test_every_backend_has_the_whole_interface():
    """What a target kind decides lives in its backend (backends.INTERFACE, docs/backends.md)."""
    import pipeline.backends as backends

    documented = (ROOT / "docs" / "backends.md").read_text()
    assert [name for name in backends.INTERFACE if name not in documented] == [], "not in docs/backends.md"
    for kind in ("llvm", "cuda", "metal", "webgpu"):
        missing = [name for name in backends.INTERFACE if not hasattr(backends.backend(kind), name)]
        assert not missing, f"backends/{kind}.py lacks {missing}"


# ---- the CLI parses arguments only (MLC-LLM's cli/ + interface/ split) ----------------------------

# what a module of pipeline/cli/ may import: the standard library, click, its own package, the
# user-facing errors and pipeline/interface/ (where the work is); anything else is work done in the CLI
CLI_MAY_IMPORT = ("pipeline.cli", "pipeline.errors", "pipeline.interface")


def _imported_modules(name: str, source: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module's source, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, node.module, node.level)
            found += [(node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base) for alias in node.names]
    return found


def _cli_work_imports(name: str, source: str) -> list[str]:
    import sys

    return [f"{name}:{line} imports {module}" for line, module in sorted(set(_imported_modules(name, source)))
            if module.split(".")[0] not in (*sys.stdlib_module_names, "click")
            and not any(module == allowed or module.startswith(allowed + ".") for allowed in CLI_MAY_IMPORT)]


def test_the_cli_imports_nothing_that_works():
    """pipeline/cli/ declares options, checks their syntax and calls pipeline/interface/; a module
    that imports the pipeline's working modules (or tvm, numpy) is doing work in the CLI."""
    assert _cli_work_imports("pipeline.cli.run", "from ..targets import load_target\nimport numpy\n") == [
        "pipeline.cli.run:1 imports pipeline.targets", "pipeline.cli.run:2 imports numpy"]
    assert not _cli_work_imports("pipeline.cli.run", "import sys\nimport click\nfrom ..interface.run import run\nfrom . import common\n")
    cli = [name for name in MODULES if name == "pipeline.cli" or name.startswith("pipeline.cli.")]
    assert "pipeline.cli.run" in cli
    offenders = [line for name in cli for line in _cli_work_imports(name, MODULES[name].read_text())]
    assert not offenders, "pipeline/cli/ may import only the stdlib, click, pipeline.errors and pipeline.interface:\n" + "\n".join(offenders)
    users = sorted(name for name, scan in SCANS.items() if name.startswith("pipeline.") and not name.startswith("pipeline.cli")
                   and any(t == "pipeline.cli" or t.startswith("pipeline.cli.") for t in scan.edges))
    assert not users, f"the pipeline does not call its CLI: {users}"


# ---- decisions on the target kind live in pipeline/backends/ -------------------------------------

TARGET_KIND_NAMES = {"llvm", "cuda", "webgpu", "metal", "vulkan", "rocm"}


def _kind_literals(node: ast.AST) -> bool:
    """A target kind's name as a string literal, or a tuple / list / set display holding one."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(e, ast.Constant) and e.value in TARGET_KIND_NAMES for e in elts)


def _names_a_kind(node: ast.AST) -> bool:
    """The expression reads a kind: `kind`, `target_kind`, `target.kind.name`, `m["kind"]`, `m.get("kind")`."""
    for n in ast.walk(node):
        if (isinstance(n, ast.Name) and "kind" in n.id.lower() or isinstance(n, ast.Attribute) and "kind" in n.attr.lower()
                or isinstance(n, ast.Constant) and n.value == "kind"):
            return True
    return False


def _kind_switches(source: str, where: str) -> list[str]:
    """Comparisons of a target kind with a kind's name (==, !=, in, not in, is), `match` cases on
    one, and tables keyed by kind names: what a backend attribute or function should answer."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_kind_literals(a) and _names_a_kind(b) or _kind_literals(b) and _names_a_kind(a)
                   for a, b in zip(operands, operands[1:])):
                found.append(f"{where}:{node.lineno}: {ast.get_source_segment(source, node)}")
        elif isinstance(node, ast.Match) and _names_a_kind(node.subject):
            if any(isinstance(p, ast.MatchValue) and _kind_literals(p.value) for case in node.cases for p in ast.walk(case.pattern)):
                found.append(f"{where}:{node.lineno}: match on a target kind")
        elif isinstance(node, ast.Dict) and any(k is not None and _kind_literals(k) for k in node.keys):
            found.append(f"{where}:{node.lineno}: a table keyed by target kind")
    return found


def test_the_kind_switch_scanner_is_precise():
    assert len(_kind_switches(
        'if target.kind.name == "llvm": pass\n'
        'if manifest["target"]["kind"] != "webgpu": pass\n'
        'ok = spec.get("kind") in ("cuda", "metal")\n'
        '_DEVICES = {"llvm": "cpu", "rocm": "rocm"}\n'
        'match target_kind:\n    case "vulkan": pass\n', "x")) == 5
    assert _kind_switches(  # sampler kernel kinds, numpy dtype kinds, kinds compared with a backend's answer
        'if kind == "argsort_global": pass\n'
        'if array.dtype.kind == "f": pass\n'
        'if kind not in kinds_with("METASCHEDULE"): pass\n'
        'target = Target({"kind": "llvm"})\n'
        'if name == "cuda": pass\n', "x") == []


def test_no_target_kind_switch_outside_the_backends():
    """What a target kind decides is a backend's attribute or function (pipeline/backends/,
    docs/backends.md); schedules/ rules test the target as dlight rules do and are not scanned."""
    offenders = [line for name, path in MODULES.items()
                 if name.startswith("pipeline.") and not name.startswith("pipeline.backends")
                 for line in _kind_switches(path.read_text(), str(path.relative_to(ROOT)))]
    assert not offenders, "target-kind switches outside pipeline/backends/:\n" + "\n".join(offenders)
