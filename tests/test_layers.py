"""The planes' layers (tools.layers): no loop between a plane's subpackages, no import from a layer up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import layers


@pytest.mark.parametrize("plane", layers.PLANES)
def test_the_plane_has_no_loop_and_no_import_up(plane: str) -> None:
    problems = layers.check(plane)
    assert not problems, "\n".join(problems)


def _plane(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "plane" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_names_each_loop_upward_import_and_undeclared_subpackage(tmp_path: Path) -> None:
    _plane(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from plane.high import thing\n",  # up, and a loop with high
        "high.py": "import plane.low.a\n\ndef f():\n    from plane import low\n",
        "mid/__init__.py": "",
        "mid/b.py": "from ..low import a\nfrom . import c\n",  # relative: low (down), mid itself (ignored)
        "extra.py": "",
    })
    problems = layers.check("plane", tmp_path, [{"low"}, {"mid"}, {"high"}])
    assert "plane.extra: not in tools/layers.py's LAYERS['plane']" in problems
    assert sum(p.startswith("loop between high, low: ") for p in problems) == 3
    assert any("plane.low (layer 0) imports plane.high (layer 2)" in p and "plane/low/a.py:1:" in p for p in problems)
    assert not any("mid" in p for p in problems)  # mid's imports go down or stay inside
    assert len(problems) == 5


def test_a_plane_without_offences_passes(tmp_path: Path) -> None:
    _plane(tmp_path, {"__init__.py": "", "low.py": "", "high.py": "from plane import low\n"})
    assert layers.check("plane", tmp_path, [{"low"}, {"high"}]) == []
    assert layers.main(["--draw"]) == 0


def test_design_draws_the_layers_of_the_table() -> None:
    design = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    for plane in layers.LAYERS:
        assert layers.draw(plane) in design, f"docs/design.md: redraw with python -m tools.layers --draw {plane}"
