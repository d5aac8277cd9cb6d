"""The layers of the project import only downwards: matrix_cli -> dashboards -> matrix -> suites ->
grace. Checked on the source (every import statement, at module level or inside a function), so an
import that would only run on some path counts as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("matrix_cli", "dashboards", "matrix", "suites", "grace")  # top first


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_no_layer_above_it(layer: str) -> None:
    above = set(LAYERS[: LAYERS.index(layer)])
    offenders = [
        f"{path.relative_to(REPO)} imports {', '.join(sorted(_imported_packages(path) & above))}"
        for path in sorted((REPO / layer).rglob("*.py"))
        if _imported_packages(path) & above
    ]
    assert not offenders, "imports upward:\n" + "\n".join(offenders)


def test_the_layers_exist() -> None:  # a renamed package would make the check above vacuous
    assert all((REPO / layer / "__init__.py").is_file() for layer in LAYERS)
