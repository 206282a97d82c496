"""The shape of the code: no import cycles in pipeline/ + schedules/, imports one way down the
layers, no private names across modules.

Read with `ast` (nothing is imported): every `import` / `from ... import`, at module level or
inside a function or under `if TYPE_CHECKING:` (a type-only import is a dependency too), is an
edge of the graph, and so is a load by name, `importlib.import_module(f"{__name__}.{kind}")` (the package's
`backend(kind)` / `device(kind)`): an edge to every submodule of the package. Importing a.b.c also
runs the packages a and a.b, unless the importer is inside them. A name starting with one underscore is private to its
module: another module may not import it (`from m import _x`) nor reach it (`m._x`); tests use
the public API too. A module whose own name starts with an underscore is private to its package.

And the tests' own layout (docs/tests.md): each test module sits where it mirrors what it tests,
no test module imports another (tests/helpers/ holds what they share), and a test that calls into
lavapipe, Dawn, Chromium, qemu or nvcc carries that hardware marker.
"""

from __future__ import annotations

import ast
import re
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


IMPORT_NAMES = {"mlcpipe.schedules": "schedules", "mlcpipe": "pipeline"}  # import name -> folder (setup.py)


def _folder_module(name: str) -> str:
    """The module `name` (as imported: mlcpipe.x, mlcpipe.schedules.x) named by its folder here
    (pipeline.x, schedules.x); other names unchanged."""
    for imported, folder in IMPORT_NAMES.items():
        if name == imported or name.startswith(imported + "."):
            return folder + name[len(imported):]
    return name


def _resolve(importer: str, module: str | None, level: int) -> str:
    if level == 0:
        return _folder_module(module or "")
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

    def _edge(self, target: str, lineno: int) -> None:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if not target or target == self.name:
            return
        if _private_module_reach(self.name, target):
            self.private.add(f"{self.name}:{lineno} imports private module {target}")
        self.edges.add(target)
        # importing a.b.c runs the __init__ of a.b and a unless the importer is already inside them
        parent = target.rpartition(".")[0]
        while parent and not (self.name == parent or self.name.startswith(parent + ".")):
            self.edges.add(parent)
            parent = parent.rpartition(".")[0]

    def visit_Call(self, node: ast.Call) -> None:
        """importlib.import_module(f"{__name__}.<anything>"): every submodule of this package."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        arg = node.args[0] if node.args else None
        if (name == "import_module" and isinstance(arg, ast.JoinedStr) and arg.values
                and isinstance(arg.values[0], ast.FormattedValue) and isinstance(arg.values[0].value, ast.Name)
                and arg.values[0].value.id == "__name__"):
            for module in MODULES:
                if module.rpartition(".")[0] == self.name:
                    self._edge(module, node.lineno)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            name = _folder_module(alias.name)
            if name.split(".")[0] not in CHECKED_PACKAGES:
                continue
            self._edge(name, node.lineno)
            if alias.asname:
                self.aliases[alias.asname] = name
            else:  # `import mlcpipe.x` binds mlcpipe
                root = alias.name.split(".")[0]
                self.aliases[root] = _folder_module(root)

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
        "import mlcpipe.backends.cuda as cuda\n"
        "from mlcpipe.schedules import analysis\n"
        "def f():\n"
        "    from .weights import convert_weights\n"
        "    return measure._secret, cuda.PTXAS_CACHE, measure.__name__\n"
        "if TYPE_CHECKING:\n"
        "    from .build import build\n"
    ))
    # the package pipeline.passes runs too; pipeline itself holds the importer
    assert {"pipeline.passes.pipeline", "pipeline.passes", "pipeline.profiler.measure", "pipeline.weights",
            "pipeline.backends.cuda", "schedules.analysis"} <= scan.edges  # import names mapped to their folders
    assert "pipeline.build" in scan.edges and "pipeline" not in scan.edges  # a type-only import is an edge too
    assert {line.split(" ", 1)[1] for line in scan.private} == {
        "imports pipeline.passes.pipeline._hidden", "uses pipeline.profiler.measure._secret"}
    outsider = _scan_source("tests.test_x", "from pipeline.profiler.reports._common import ROLES\n")
    assert [line.split(" ", 1)[1] for line in outsider.private] == ["imports private module pipeline.profiler.reports._common"]
    insider = _scan_source("pipeline.profiler.reports.html", "from ._common import ROLES\n")
    assert not insider.private
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # a load by name is an edge to every module of the package: a kind module importing its package is a cycle
    by_name = _scan_source("pipeline.device", "import importlib\ndef device(kind):\n    return importlib.import_module(f'{__name__}.{kind}')\n")
    assert {"pipeline.device.llvm", "pipeline.device.cuda", "pipeline.device.tvm_runtime"} <= by_name.edges
    assert {"pipeline.device.llvm", "pipeline.device.webgpu"} <= SCANS["pipeline.device"].edges
    assert {"pipeline.backends.llvm", "pipeline.backends.cuda"} <= SCANS["pipeline.backends"].edges
    assert _scan_source("schedules.script_stack", "import importlib\nimportlib.import_module(name)\n").edges == set()


# ---- layers: config -> model -> quantize -> passes -> schedules -> target (compile half) -> artifact
# -> device (run half) -> runtime -> profiler -> interface -> cli; a module imports only its own
# layer and those before it. Each module's layer: the longest prefix of its name listed below.
LAYERS = (
    # names and formats everything reads: errors, the YAML config, the quantization registry (names,
    # formats, dequantize patterns, tolerances), kernel roles, the tokenizer
    ("config", ("pipeline", "pipeline.errors", "pipeline.config", "pipeline.conv_templates", "pipeline.hf_config", "pipeline.threads",
                "pipeline.tokenizer", "pipeline.roles", "pipeline.quantization")),
    ("model", ("pipeline.model",)),
    ("quantize", ("pipeline.quantization.relax_modules", "pipeline.model.create")),  # the model built with quantized layers
    ("passes", ("pipeline.passes",)),
    ("schedules", ("schedules", "pipeline.kernel_inputs", "pipeline.kernel_info")),
    ("target", ("pipeline.backends", "pipeline.targets", "pipeline.library", "pipeline.reference")),
    ("artifact", ("pipeline.artifact", "pipeline.tensor_cache", "pipeline.mlc_contract", "pipeline.weights", "pipeline.build",
                  "pipeline.tuning")),
    ("device", ("pipeline.device", "pipeline.rpc")),
    ("runtime", ("pipeline.generation", "pipeline.runtime", "pipeline.runners", "pipeline.conformance", "pipeline.tuning.knobs",
                 "pipeline.tuning.metaschedule")),  # the tuners time candidates on the device
    ("profiler", ("pipeline.profiler", "pipeline.runners.webgpu.profile")),  # WebGPU's profile driver, beside its engine
    ("interface", ("pipeline.interface", "pipeline.nightly")),
    ("cli", ("pipeline.cli",)),
)


def _layer(module: str, layers=LAYERS) -> int | None:
    best = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def _upward(scans: dict, layers=LAYERS) -> list[str]:
    """Imports from a module to one of a later layer, and modules of no layer."""
    found = []
    for name, scan in sorted(scans.items()):
        if name.split(".")[0] not in GRAPH_PACKAGES:
            continue
        mine = _layer(name, layers)
        if mine is None:
            found.append(f"{name}: in no layer (add it to LAYERS)")
            continue
        for target in sorted(scan.edges):
            theirs = _layer(target, layers) if target.split(".")[0] in GRAPH_PACKAGES else None
            if theirs is not None and theirs > mine:
                found.append(f"{name} ({layers[mine][0]}) imports {target} ({layers[theirs][0]})")
    return found


def test_the_layer_check_finds_imports_up_the_layers(monkeypatch):
    layers = (("low", ("pipeline.low",)), ("high", ("pipeline.high", "pipeline.low.top")))
    for name in ("pipeline.low", "pipeline.low.a", "pipeline.low.top", "pipeline.high", "pipeline.other"):
        monkeypatch.setitem(MODULES, name, ROOT / (name.replace(".", "/") + ".py"))
    sources = {"pipeline.low.a": "def f():\n    from ..high import x\n",  # inside a function: an edge too
               "pipeline.low.top": "from ..high import x\n",  # a longer prefix puts it in the higher layer
               "pipeline.high": "from .low import a\n", "pipeline.other": ""}
    scans = {name: _scan_source(name, source) for name, source in sources.items()}
    assert _upward(scans, layers) == ["pipeline.low.a (low) imports pipeline.high (high)", "pipeline.other: in no layer (add it to LAYERS)"]


def test_imports_run_one_way_down_the_layers():
    offenders = _upward(SCANS)
    assert not offenders, "imports up the layers (tests/test_layout.py LAYERS):\n" + "\n".join(offenders)


def _quantization_names(source: str) -> list[str]:
    """Where a module handles a quantization by its name: a `QUANTIZATIONS[...]` lookup, or a
    `quant` / `quantization` parameter or field annotated `str`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "QUANTIZATIONS":
            found.append((node.lineno, f"QUANTIZATIONS[{ast.unparse(node.slice)}]"))
        named = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            named = [(a.arg, a.annotation) for a in node.args.args + node.args.kwonlyargs]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named = [(node.target.id, node.annotation)]
        for name, annotation in named:
            if name in ("quant", "quantization") and annotation is not None and re.search(r"\bstr\b", ast.unparse(annotation)):
                found.append((node.lineno, f"{name}: {ast.unparse(annotation)}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_quantization_name_scan_finds_lookups_and_str_parameters():
    source = ("def f(config, quant: str):\n    return QUANTIZATIONS[quant].tolerance\n"
              "def g(quant: Quantization, name: str):\n    return quant.name\n"
              "class C:\n    quantization: str | None\n")
    assert _quantization_names(source) == ["line 1: quant: str", "line 2: QUANTIZATIONS[quant]", "line 6: quantization: str | None"]


def test_below_the_interface_quantizations_travel_as_schemes():
    """The interface (and the benchmarks, scripts) turn a name into its scheme once
    (ModelConfig.scheme / quantization.quantization); every layer below takes the scheme."""
    interface = next(i for i, (layer, _) in enumerate(LAYERS) if layer == "interface")
    offenders = []
    for name, path in sorted(MODULES.items()):
        layer = _layer(name) if name.split(".")[0] in GRAPH_PACKAGES else None
        if layer is None or layer >= interface or name == "pipeline.quantization" or name.startswith("pipeline.quantization."):
            continue
        offenders += [f"{path.relative_to(ROOT)} {where}" for where in _quantization_names(path.read_text())]
    assert not offenders, "quantization names below the interface:\n" + "\n".join(offenders)


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


def _folder_name_imports(source: str) -> list[str]:
    """Absolute imports of `pipeline` / `schedules` by their folder names: they resolve only from
    the checkout's root (on sys.path there), never in an installed mlcpipe (one import name,
    mlcpipe: setup.py)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] in GRAPH_PACKAGES]
    return found


def test_code_imports_mlcpipe_not_the_folder_names():
    assert _folder_name_imports("import pipeline.config\nfrom schedules import RULES\nfrom mlcpipe import config\n") == [
        "line 1: pipeline.config", "line 2: schedules"]
    bad = {}
    for folder in (*CHECKED_PACKAGES, "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" not in path.parts and (found := _folder_name_imports(path.read_text())):
                bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad


MAX_FUNCTION_LINES = 80


def _is_prim_func(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "prim_func"


def _long_functions(source: str, where: str) -> list[str]:
    """Functions over MAX_FUNCTION_LINES lines, but for those that write a TVMScript kernel (a
    @T.prim_func, or a function defining one: a kernel reads best whole)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = node.end_lineno - node.lineno + 1
        kernel = any(_is_prim_func(d) for inner in ast.walk(node) if isinstance(inner, ast.FunctionDef) for d in inner.decorator_list)
        if lines > MAX_FUNCTION_LINES and not kernel:
            found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines_outside_kernels():
    long_one = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    kernel = "def k():\n    @T.prim_func\n    def main():\n" + "        x = 1\n" * MAX_FUNCTION_LINES
    assert _long_functions(long_one, "a.py") == [f"a.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"] and _long_functions(kernel, "b.py") == []
    found = [f for folder in GRAPH_PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))
             for f in _long_functions(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, found


def test_every_backend_has_the_whole_interface():
    """What a target kind decides lives in its backend (compile half: backends.INTERFACE) and its
    device module (run half: device.INTERFACE), as docs/backends.md lists them; neither half
    defines the other's names."""
    import mlcpipe.backends as backends
    import mlcpipe.device as device

    doc = (ROOT / "docs" / "backends.md").read_text()
    for package, heading, get in ((backends, "## The backend interface", backends.backend), (device, "## The device interface", device.device)):
        assert sorted(package.INTERFACE) == sorted(_documented_interface(doc, heading)), f"{package.__name__}.INTERFACE vs docs/backends.md"
        for kind in backends.KINDS:
            missing = [name for name in package.INTERFACE if not hasattr(get(kind), name)]
            assert not missing, f"{package.__name__}.{kind} lacks {missing}"
    assert not set(backends.INTERFACE) & set(device.INTERFACE)
    for kind in backends.KINDS:
        assert not [n for n in device.INTERFACE if hasattr(backends.backend(kind), n)], f"backends/{kind}.py defines run-side names"


def _documented_interface(doc: str, heading: str = "## The backend interface") -> list[str]:
    """The names an interface block of docs/backends.md (the first after `heading`) defines: each
    entry line (four spaces in) up to its description (two or more spaces), split at top-level
    commas, each item's leading name."""
    block = doc.split(heading, 1)[1].split("```", 2)[1]
    names = []
    for line in block.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue  # headings and description continuations
        head, depth, item = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0], 0, ""
        for ch in head + ",":
            depth += ch in "([" and 1 or (ch in ")]" and -1 or 0)
            if ch == "," and depth == 0:
                names.append(re.match(r"\s*([A-Za-z_]\w*)", item).group(1))
                item = ""
            else:
                item += ch
    return names


def test_documented_interface_parser():
    doc = "## The backend interface\n```\nSide:\n    A, b(x, y) -> z                 text\n        more text\n    C_D     text\n```\n"
    assert _documented_interface(doc) == ["A", "b", "C_D"]


# ---- the tests' own layout (docs/tests.md) ------------------------------------------------------

TESTS = ROOT / "tests"
# the only test modules flat in tests/ besides tests/test_<module>.py for a pipeline/<module>.py
CROSS_CUTTING = {"test_layout", "test_end_to_end", "test_hostile_inputs", "test_outputs", "test_benchmarks"}
NO_TESTS = ("helpers", "data")  # tests/helpers/: what tests share; tests/data/: their files
HARDWARE_MARKERS = {"lavapipe", "dawn", "browser", "qemu", "nvcc", "gpu"}
# Calls (by the name called) that use what a hardware marker stands for; any one marker of the set
# covers the call. `shutil.which(tool)` probes for the tools in WHICH.
HARDWARE_CALLS = {
    "get_device": {"lavapipe"}, "run_primfunc": {"lavapipe"}, "subgroup_sizes": {"lavapipe"},
    "WebGPUEngine": {"dawn", "browser"}, "KernelRunner": {"dawn", "browser"}, "DawnRunner": {"dawn", "browser"},
    "webllm_complete": {"browser"}, "chromium_path": {"browser"},
    "find_nvcc": {"nvcc"}, "compile_fatbin": {"nvcc"}, "ptxas_report": {"nvcc"},
    "link_aarch64": {"qemu"}, "run_aarch64": {"qemu"},
}  # fmt: skip
WHICH = {"node": {"dawn", "browser"}, "nodejs": {"dawn", "browser"}, "chromium": {"browser"}, "nvcc": {"nvcc"}, "ptxas": {"nvcc"}, "qemu-aarch64": {"qemu"}}
_IMPORT_IN_TEXT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)


def _misplaced(root: Path = ROOT) -> list[str]:
    """Test modules that do not sit where the package part they test is mirrored, and directories of
    tests without an __init__.py (the tests are packages: `from tests.helpers... import`)."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        rel = path.relative_to(root / "tests")
        parts = rel.parts[:-1]
        if not (path.parent / "__init__.py").is_file():
            found.append(f"tests/{rel}: tests/{'/'.join(parts)}/ has no __init__.py")
        if not path.name.startswith("test_"):
            continue
        if not parts:
            module = path.stem[len("test_"):]
            if path.stem not in CROSS_CUTTING and not (root / "pipeline" / f"{module}.py").is_file():
                found.append(f"tests/{rel}: flat in tests/, but neither cross-cutting {sorted(CROSS_CUTTING)} "
                             f"nor the tests of a pipeline/{module}.py: move it to the directory of what it tests")
        elif parts[0] in NO_TESTS:
            found.append(f"tests/{rel}: tests/{parts[0]}/ holds no tests")
        else:
            mirrored = root.joinpath("schedules", *parts[1:]) if parts[0] == "schedules" else root.joinpath("pipeline", *parts)
            if not (mirrored.is_dir() or mirrored.with_suffix(".py").is_file()):
                found.append(f"tests/{rel}: tests/{'/'.join(parts)}/ mirrors no package part "
                             f"({mirrored.relative_to(root)}/ or .py does not exist)")
    return found


def _imports_of_test_modules(name: str, source: str) -> list[str]:
    """Imports of a test module (`test_*`, by any path: tests.x.test_y, .test_y, `from . import
    test_y`, or a `test_y` put on sys.path) by `name`, also inside code written out as text (a
    subprocess's script)."""
    found: list[tuple[int, str]] = []

    def check(targets: list[str], lineno: int, how: str) -> None:
        hit = next((t for t in targets if any(part.startswith("test_") for part in t.split("."))), None)
        if hit is not None:
            found.append((lineno, f"{name}:{lineno} {how} {hit}"))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            check([alias.name for alias in node.names], node.lineno, "imports")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, node.module, node.level)
            check([base] + [f"{base}.{alias.name}" for alias in node.names], node.lineno, "imports")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            check([m.group(1) for m in _IMPORT_IN_TEXT.finditer(node.value)], node.lineno, "writes code importing")
    return [line for _, line in sorted(found)]


# -- what a test uses of the hardware, against its markers --


def _mark_names(node: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    """Hardware markers named anywhere in `node`: pytest.mark.X, pytest.mark.X(...), an alias of
    those, pytest.param(..., marks=...) inside a parametrize."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and sub.attr in HARDWARE_MARKERS and isinstance(sub.value, ast.Attribute)
                and sub.value.attr == "mark"):
            names.add(sub.attr)
        elif isinstance(sub, ast.Name) and sub.id in aliases:
            names |= aliases[sub.id]
    return names


def _is_fixture(func: ast.FunctionDef) -> bool:
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


class _TestModule:
    """One module's functions, fixtures, markers and imported helper functions, from its source."""

    def __init__(self, name: str, source: str):
        self.name = name
        self.tree = ast.parse(source)
        self.functions: dict[str, ast.FunctionDef] = {}
        self.fixtures: set[str] = set()
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (helper module, function)
        aliases: dict[str, set[str]] = {}
        self.module_marks: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
                if _is_fixture(node):
                    self.fixtures.add(node.name)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, node.module, node.level)
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                marks = _mark_names(node.value, aliases)
                if node.targets[0].id == "pytestmark":
                    self.module_marks |= marks
                elif marks:
                    aliases[node.targets[0].id] = marks
        self.aliases = aliases

    def marks(self, test: str) -> set[str]:
        func = self.functions[test]
        return self.module_marks | set().union(*(_mark_names(d, self.aliases) for d in func.decorator_list))


class _HardwareUse:
    """What tests use of the hardware: their own calls, those of the module's functions they call
    and fixtures they request (conftest's too), and those of the tests.helpers functions they import."""

    def __init__(self, sources: dict[str, str]):
        self.modules = {name: _TestModule(name, source) for name, source in sources.items()}
        self._memo: dict[tuple[str, str], list[tuple[str, frozenset[str]]]] = {}

    def _fixture_owner(self, module: str, name: str) -> str | None:
        """Where pytest finds fixture `name` for `module`: the module itself, else the nearest conftest.py."""
        package = module.split(".")[:-1]
        for owner in [module] + [".".join(package[:i] + ["conftest"]) for i in range(len(package), 0, -1)]:
            if owner in self.modules and name in self.modules[owner].fixtures:
                return owner
        return None

    def of(self, module: str, function: str, seen: frozenset = frozenset()) -> list[tuple[str, frozenset[str]]]:
        """[(what is called, the markers that cover it)] of `function` in `module`, transitively."""
        key = (module, function)
        if key in self._memo:
            return self._memo[key]
        if key in seen or module not in self.modules or function not in self.modules[module].functions:
            return []
        mod, seen = self.modules[module], seen | {key}
        func = mod.functions[function]
        uses: list[tuple[str, frozenset[str]]] = []
        for arg in func.args.args:  # the fixtures it requests
            owner = self._fixture_owner(module, arg.arg)
            if owner is not None:
                uses += self.of(owner, arg.arg, seen)
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if called in HARDWARE_CALLS:
                uses.append((f"{called}()", frozenset(HARDWARE_CALLS[called])))
            elif called == "which" and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in WHICH:
                uses.append((f"shutil.which({node.args[0].value!r})", frozenset(WHICH[node.args[0].value])))
            elif isinstance(node.func, ast.Name) and called in mod.functions and called not in mod.fixtures:
                uses += [(f"{called}() -> {what}", need) for what, need in self.of(module, called, seen)]
            elif isinstance(node.func, ast.Name) and called in mod.imported:
                helper, name = mod.imported[called]
                uses += [(f"{called}() -> {what}", need) for what, need in self.of(helper, name, seen)]
        self._memo[key] = uses
        return uses

    def unmarked(self) -> list[str]:
        found = []
        for name, mod in self.modules.items():
            if not name.rpartition(".")[2].startswith("test_"):
                continue
            for test in (f for f in mod.functions if f.startswith("test_")):
                marks = mod.marks(test)
                for what, need in self.of(name, test):
                    if not marks & need:
                        found.append(f"{name}::{test} calls {what} without @pytest.mark.{' or '.join(sorted(need))}")
        return sorted(set(found))


def _test_sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in MODULES.items() if name.split(".")[0] == "tests"}


def test_the_test_layout_checks_find_what_they_look_for(tmp_path):
    # a test module importing another, directly, relatively, as a module, or in a subprocess's script
    found = _imports_of_test_modules("tests.profiler.test_a", (
        "from tests.test_errors import mlcpipe\n"
        "from .test_reports import sample_groups\n"
        "from . import test_reports as checks\n"
        "from tests.helpers.cli import mlcpipe\n"
        "SCRIPT = '''\nimport sys\nfrom test_gpu_rules import fused_kernels\n'''\n"
    ))
    assert [line.split(" ", 1)[1] for line in found] == [
        "imports tests.test_errors", "imports tests.profiler.test_reports", "imports tests.profiler.test_reports",
        "writes code importing test_gpu_rules"]
    # a module flat in tests/, one in a directory that mirrors nothing, a test among the helpers, no __init__.py
    (tmp_path / "pipeline" / "profiler").mkdir(parents=True)
    (tmp_path / "pipeline" / "threads.py").write_text("")
    (tmp_path / "schedules" / "llvm").mkdir(parents=True)
    for rel in ("test_threads.py", "test_layout.py", "test_gpu_rules.py", "profiler/test_compare.py", "schedules/llvm/test_rules.py",
                "schedules/cpu/test_rules.py", "helpers/test_cli.py", "nightly/test_nightly.py"):
        (tmp_path / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / rel).write_text("")
    for rel in ("", "profiler", "schedules", "schedules/llvm", "schedules/cpu", "helpers"):
        (tmp_path / "tests" / rel / "__init__.py").write_text("")
    assert [line.split(":")[0] for line in _misplaced(tmp_path)] == [
        "tests/helpers/test_cli.py", "tests/nightly/test_nightly.py", "tests/nightly/test_nightly.py",
        "tests/schedules/cpu/test_rules.py", "tests/test_gpu_rules.py"]
    # hardware used without its marker: directly, through a fixture, a local helper, a tests.helpers function
    hardware = _HardwareUse({
        "tests.helpers.runs": "def run_it(f):\n    return runner.run_primfunc(f, t, [])\n",
        "tests.conftest": "import pytest\n@pytest.fixture\ndef engine():\n    return WebGPUEngine('a')\n",
        "tests.x.test_y": (
            "import shutil, pytest\nfrom tests.helpers.runs import run_it\n"
            "needs_lavapipe = pytest.mark.lavapipe(skip_if_missing=True)\n"
            "@pytest.fixture(scope='module')\ndef cuda_built():\n    return shutil.which('nvcc')\n"
            "def probe():\n    return shutil.which('node') or shutil.which('nodejs')\n"
            "def test_fixture(cuda_built): pass\n"
            "@pytest.mark.nvcc\ndef test_fixture_marked(cuda_built): pass\n"
            "def test_local_helper(): probe()\n"
            "@pytest.mark.browser(skip_if_missing=True)\ndef test_local_helper_marked(): probe()\n"
            "def test_imported_helper(): run_it(1)\n"
            "@needs_lavapipe\ndef test_imported_helper_marked(): run_it(1)\n"
            "def test_conftest_fixture(engine): pass\n"
            "@pytest.mark.parametrize('k', [pytest.param(1, marks=pytest.mark.dawn)])\ndef test_param_marked(engine, k): pass\n"
            "def test_nothing(tmp_path): shutil.which('gcc')\n"
        ),
    })
    assert [line.split(" without ")[0] for line in hardware.unmarked()] == [
        "tests.x.test_y::test_conftest_fixture calls WebGPUEngine()",
        "tests.x.test_y::test_fixture calls shutil.which('nvcc')",
        "tests.x.test_y::test_imported_helper calls run_it() -> run_primfunc()",
        "tests.x.test_y::test_local_helper calls probe() -> shutil.which('node')",
        "tests.x.test_y::test_local_helper calls probe() -> shutil.which('nodejs')",
    ]


def test_tests_mirror_the_package():
    misplaced = _misplaced()
    assert not misplaced, "test modules out of place (docs/tests.md):\n" + "\n".join(misplaced)


def test_no_test_module_imports_another():
    """What tests share lives in tests/helpers/ (or a conftest.py fixture), not in a test module."""
    found = [line for name, source in _test_sources().items() for line in _imports_of_test_modules(name, source)
             if not line.startswith(f"{__name__}:") or " imports " in line]  # the examples above are text
    assert not found, "test modules imported (move what they share to tests/helpers/):\n" + "\n".join(found)


def test_tests_that_use_hardware_carry_its_marker():
    """A test that calls into lavapipe, Dawn, Chromium or nvcc itself (or through the fixtures and
    helpers it uses) carries the marker, so `-m 'not nvcc'` leaves it out and conftest can skip it.
    Only direct calls are seen: a test driving them through the CLI is marked by hand."""
    unmarked = _HardwareUse(_test_sources()).unmarked()
    assert not unmarked, "tests using hardware without its marker (docs/tests.md):\n" + "\n".join(unmarked)


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


# ---- decisions on the target kind live in pipeline/backends/ and pipeline/device/ -----------------

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
    """What a target kind decides is an attribute or function of its backend or device module
    (pipeline/backends/, pipeline/device/, docs/backends.md); schedules/ rules test the target as
    dlight rules do and are not scanned."""
    offenders = [line for name, path in MODULES.items()
                 if name.startswith("pipeline.") and not name.startswith(("pipeline.backends", "pipeline.device"))
                 for line in _kind_switches(path.read_text(), str(path.relative_to(ROOT)))]
    assert not offenders, "target-kind switches outside pipeline/backends/ and pipeline/device/:\n" + "\n".join(offenders)


def test_the_webgpu_run_side_is_one_folder():
    """WebGPU's run side (engines, kernel runner, WebLLM, its profile driver, the node / browser
    programs) lives in pipeline/runners/webgpu/; elsewhere only the compile half
    (backends/webgpu.py) and the device interface (device/webgpu.py) carry the name."""
    pipeline = ROOT / "pipeline"
    web_files = [p.relative_to(pipeline).as_posix() for p in pipeline.rglob("*") if p.suffix in (".mjs", ".html")]
    assert web_files and all(f.startswith("runners/webgpu/js/") for f in web_files), web_files
    named = sorted(p.relative_to(pipeline).as_posix() for p in pipeline.rglob("*.py") if re.search(r"webgpu|dawn|webllm|browser", p.as_posix()))
    assert [f for f in named if not f.startswith("runners/webgpu/")] == ["backends/webgpu.py", "device/webgpu.py"], named
