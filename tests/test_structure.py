"""The shape of the ``grace`` package, checked from its source with ``ast`` (no torch needed).

Rules (STYLE.md habits 1, 2 and 9):
1. No import cycle among ``grace`` modules. Every import counts wherever it is written: at module
   level, inside a function (a lazy import is a cycle that waits for its first call), and constant
   ``importlib.import_module("grace.x")`` calls. Imports under ``if TYPE_CHECKING:`` do not count (they
   never run). ``from grace.pkg import name`` is an edge to ``grace.pkg.name`` when that is a module,
   else to ``grace.pkg``. Initialising a parent package on the way to a submodule is not an edge (every
   module would otherwise depend on ``grace/__init__.py``).
2. No module over 500 lines.
3. No function (or method) over 80 lines, decorators excluded, docstring included.
4. ``grace`` imports nothing of ``matrix``, ``dashboards`` or ``suites``.
5. No private torch or Triton access outside ``grace/compat/``: no import of a ``torch._x`` or
   ``triton._x`` module, and no attribute chain ``torch._x`` / ``triton._x`` (dunders and operators
   under ``torch.ops`` are public).
6. The technique packages ``grace.cgct`` and ``grace.pi`` are imported only by their own modules; the
   rest of grace reaches them through ``grace.seams.load_seam`` (by name, so that a technique that
   fails to import costs only itself).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRACE = ROOT / "grace"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
FORBIDDEN_PACKAGES = ("matrix", "dashboards", "suites")
PRIVATE_ROOTS = ("torch", "triton")
TECHNIQUE_PACKAGES = ("grace.cgct", "grace.pi")


@dataclass(frozen=True)
class Source:
    module: str
    path: Path
    tree: ast.Module
    lines: int

    @property
    def relative(self) -> str:
        return str(self.path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> list[Source]:
    found = []
    for path in sorted(GRACE.rglob("*.py")):
        text = path.read_text()
        found.append(Source(_module_name(path), path, ast.parse(text, str(path)), len(text.splitlines())))
    return found


SOURCES = _sources()
MODULES = {s.module for s in SOURCES}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imported_modules(source: Source, runtime_only: bool = True) -> Iterator[tuple[str, int]]:
    """(module name, line) of every import in ``source``, resolved as the module docstring says."""
    nodes = _runtime_nodes(source.tree) if runtime_only else ast.walk(source.tree)
    package = source.module if source.path.name == "__init__.py" else source.module.rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in MODULES else base), node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


def _grace_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {s.module: set() for s in SOURCES}
    for source in SOURCES:
        for target, _ in _imported_modules(source):
            if target in MODULES and target != source.module:
                graph[source.module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _edges_within(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    members = set(component)
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]


def test_no_import_cycle_among_grace_modules() -> None:
    graph = _grace_graph()
    problems = [f"{' / '.join(c)}: {'; '.join(_edges_within(graph, c))}" for c in _cycles(graph)]
    assert not problems, "import cycles (break them; see this file's docstring):\n" + "\n".join(problems)


def test_no_grace_module_over_500_lines() -> None:
    long = [f"{s.relative}: {s.lines} lines" for s in SOURCES if s.lines > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept):\n" + "\n".join(long)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_no_grace_function_over_80_lines() -> None:
    long = []
    for source in SOURCES:
        for fn in _functions(source.tree):
            length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                long.append(f"{source.relative}:{fn.name}:{fn.lineno}-{fn.end_lineno} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_grace_imports_nothing_of_the_matrix_the_dashboards_or_the_suites() -> None:
    wrong = [
        f"{source.relative}:{line}: {target}"
        for source in SOURCES
        for target, line in _imported_modules(source, runtime_only=False)
        if target.split(".")[0] in FORBIDDEN_PACKAGES
    ]
    assert not wrong, "grace must not depend on the packages above it:\n" + "\n".join(wrong)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _attribute_chain(node: ast.Attribute) -> list[str]:
    chain = [node.attr]
    value: ast.expr = node.value
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    if isinstance(value, ast.Name):
        chain.append(value.id)
    return chain[::-1]


def _private_uses(source: Source) -> Iterator[str]:
    inner = {
        id(node.value)
        for node in ast.walk(source.tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
    }
    for node in ast.walk(source.tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            names = [".".join(_attribute_chain(node))]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["torch", "ops"]:
                continue  # operator namespaces: ``torch.ops.aten._to_copy`` is a public op
            if parts[0] in PRIVATE_ROOTS and any(_is_private(p) for p in parts[1:]):
                yield f"{source.relative}:{node.lineno}: {name}"


def test_private_torch_and_triton_access_only_in_compat() -> None:
    outside = [s for s in SOURCES if not s.module.startswith("grace.compat")]
    found = sorted({use for source in outside for use in _private_uses(source)})
    assert not found, (
        "private torch/Triton access outside grace/compat (add a capability there):\n" + "\n".join(found)
    )


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_technique_packages_are_reached_through_the_seam() -> None:
    direct = [
        f"{source.relative}:{line}: {target}"
        for source in SOURCES
        for target, line in _imported_modules(source)
        for package in TECHNIQUE_PACKAGES
        if _inside(target, package) and not _inside(source.module, package)
    ]
    assert not direct, "import these through grace.seams.load_seam:\n" + "\n".join(sorted(set(direct)))


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
