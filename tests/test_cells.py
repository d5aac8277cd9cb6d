"""matrix.toml: the shipped matrix covers what it must, and every malformed file gives one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from matrix.cells import CellKind, IndexMode, Installer, load_matrix, parse_matrix
from matrix.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
format = 1
default_tag = "quick"

[[cells]]
id = "torch-2.4"
kind = "venv"
torch = "2.4.1"
triton = "3.0.0"
cuda = "12.1"
tags = ["quick"]
"""


@pytest.fixture(scope="module")
def shipped():
    return load_matrix(ROOT / "matrix.toml")


def test_shipped_matrix_covers_torch_2_4_to_2_15_with_pinned_triton(shipped) -> None:
    releases = [c for c in shipped.cells if c.kind is CellKind.VENV and "canary" not in c.tags]
    assert len(releases) >= 12
    minors = {(c.torch.major, c.torch.minor) for c in releases}
    assert minors == {(2, m) for m in range(4, 16)}
    pins = {f"{c.torch.major}.{c.torch.minor}": (str(c.triton), c.cuda) for c in releases}
    # DESIGN.md section 5: the Triton each torch release pins and the CUDA of its default wheel.
    assert pins["2.4"] == ("3.0.0", "12.1")
    assert pins["2.7"][0].startswith("3.3.") and pins["2.7"][1] == "12.6"
    assert pins["2.11"] == ("3.6.0", "13.0")
    assert pins["2.13"] == ("3.7.1", "13.0")
    assert pins["2.15"][0].startswith("3.9.") and pins["2.15"][1] == "13.2"
    for cell in releases:
        assert cell.torch is not None and cell.triton is not None
        assert cell.torch_requirement == f"torch=={cell.torch}"


def test_shipped_matrix_has_canaries_triton_only_and_current(shipped) -> None:
    release_triton = {
        (c.torch.major, c.torch.minor): c.triton
        for c in shipped.cells
        if c.kind is CellKind.VENV and "canary" not in c.tags
    }
    canaries = [c for c in shipped.cells if "canary" in c.tags]
    assert canaries
    for canary in canaries:  # an older torch with a newer Triton than it pins
        assert canary.triton > release_triton[(canary.torch.major, canary.torch.minor)]
    triton_only = [c for c in shipped.cells if c.kind is CellKind.TRITON_ONLY]
    assert {(c.triton.major, c.triton.minor) for c in triton_only} == {(3, m) for m in range(10)}
    assert all(c.torch is None and c.markers == "pi" for c in triton_only)
    current = shipped.cell("current")
    assert current.kind is CellKind.CURRENT and current.torch is None and current.extras == ()


def test_shipped_multi_gpu_cell_runs_only_the_tp_suite_outside_quick(shipped) -> None:
    cell = shipped.cell("current-multi-gpu")
    assert cell.kind is CellKind.CURRENT and cell.torch is None and cell.cuda is None
    assert (cell.markers, cell.tier, cell.tags) == ("tp", "standard", ("nightly", "multi-gpu"))
    assert "2+ GPUs" in cell.description
    assert cell not in shipped.select() and [c.id for c in shipped.select(["multi-gpu"])] == [cell.id]


def test_quick_is_the_default_and_small_nightly_is_everything(shipped) -> None:
    quick = shipped.select()
    assert shipped.default_tag == "quick"
    assert [c.id for c in quick] == ["torch-2.13", "triton-3.7"]
    assert quick[0].installer is Installer.PIP and quick[0].torch == Version("2.13.0")
    assert shipped.select(["nightly"]) == shipped.cells


def test_select_by_id_and_unknown_names(shipped) -> None:
    assert [c.id for c in shipped.select(ids=["torch-2.4", "current"])] == ["torch-2.4", "current"]
    with pytest.raises(ConfigError, match=r"no cell 'torch-9\.9'"):
        shipped.select(ids=["torch-9.9"])
    with pytest.raises(ConfigError, match="no cell carries tag 'weekly'"):
        shipped.select(["weekly"])


def test_exclusions_apply_by_python_and_platform(shipped) -> None:
    torch24 = shipped.cell("torch-2.4")
    assert shipped.exclusion_for(torch24, "3.11.7", "linux-x86_64") is None
    assert "3.13" in shipped.exclusion_for(torch24, "3.13.1", "linux-x86_64").reason
    assert "Linux only" in shipped.exclusion_for(torch24, "3.11.7", "darwin-arm64").reason
    assert shipped.exclusion_for(shipped.cell("current"), "3.11.7", "darwin-arm64") is None


def test_indexes_per_cuda_variant() -> None:
    text = MINIMAL + '\n[indexes]\ncu121 = { url = "https://example.org/whl/cu121", mode = "replace" }\n'
    matrix = parse_matrix(_toml(text))
    index = matrix.index_for(matrix.cell("torch-2.4"))
    assert index is not None and index.mode is IndexMode.REPLACE
    assert index.installer_args() == ("--index-url", "https://example.org/whl/cu121")


def test_defaults_merge_global_kind_and_cell() -> None:
    text = MINIMAL.replace('tags = ["quick"]', 'tags = ["quick"]\ntier = "standard"') + (
        '\n[defaults]\ntags = ["nightly"]\ninstaller = "uv"\n'
        '[kinds.venv]\nextras = ["suites"]\nmarkers = "not slow"\n'
    )
    cell = parse_matrix(_toml(text)).cell("torch-2.4")
    assert cell.tags == ("nightly", "quick")
    assert cell.installer is Installer.UV and cell.extras == ("suites",) and cell.markers == "not slow"
    assert cell.tier == "standard"


@pytest.mark.parametrize(
    ("old", "new", "where", "problem"),
    [
        ('torch = "2.4.1"', 'torch = "2.4.x"', "cells[0].torch", "not a PEP 440 version"),
        ('torch = "2.4.1"', 'torch = ">=2.4"', "cells[0].torch", "not a PEP 440 version"),
        ('triton = "3.0.0"', 'triton = "v3.0.0"', "cells[0].triton", "canonical form"),
        ('triton = "3.0.0"', "triton = 3.0", "cells[0].triton", "expected str"),
        ('cuda = "12.1"', 'cuda = "twelve"', "cells[0].cuda", "not a CUDA version"),
        ('kind = "venv"', 'kind = "conda"', "cells[0].kind", "not one of venv, current, triton-only"),
        ('id = "torch-2.4"', 'id = "Torch 2.4"', "cells[0].id", "not a valid id"),
        ('cuda = "12.1"', 'cuda = "12.1"\npython = "3.11"', "cells[0].python", "unknown key 'python'"),
        ('triton = "3.0.0"\n', "", "cells[0].triton", "pins both torch and triton"),
        ("format = 1", "format = 2", "format", "newer than this grace-matrix reads"),
        ('default_tag = "quick"', 'default_tag = "weekly"', "default_tag", "no cell carries the default tag"),
        ('tags = ["quick"]', 'tags = ["quick"]\ntier = "huge"', "cells[0].tier", "not a suite tier"),
        (
            'tags = ["quick"]',
            'tags = ["quick"]\npaths = ["../elsewhere"]',
            "cells[0].paths",
            "inside the project",
        ),
    ],
)
def test_malformed_matrix_gives_one_clear_error(tmp_path, old, new, where, problem) -> None:
    assert old in MINIMAL
    path = tmp_path / "matrix.toml"
    path.write_text(MINIMAL.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {where}: ")
    assert problem in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ('\n[[cells]]\nid = "torch-2.4"\nkind = "current"\n', "duplicate cell id 'torch-2.4'"),
        (
            '\n[[cells]]\nid = "t"\nkind = "triton-only"\ntorch = "2.4.1"\ntriton = "3.0.0"\n',
            "pins triton and no torch",
        ),
        ('\n[[cells]]\nid = "c"\nkind = "current"\ntorch = "2.4.1"\n', "pins no versions"),
        ('\n[[exclude]]\ncells = "*"\nreason = "r"\npython = "3.13+"\n', "not a PEP 440 version specifier"),
        ('\n[[exclude]]\ncells = "*"\n', "exclude[0].reason: is required"),
        ('\n[indexes]\ncu121 = { url = "ftp://x" }\n', "not an http(s):// or file:// URL"),
        ("\nsurprise = 1\n", "unknown key 'surprise'"),
    ],
)
def test_malformed_additions_give_one_clear_error(tmp_path, extra, problem) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(MINIMAL + extra)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert problem in str(info.value)
    assert "\n" not in str(info.value)


def test_invalid_toml_and_missing_file(tmp_path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(MINIMAL + "\n[[cells]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_matrix(path)
    with pytest.raises(ConfigError, match="matrix file not found"):
        load_matrix(tmp_path / "absent.toml")


def _toml(text: str):
    import tomllib

    return tomllib.loads(text)
