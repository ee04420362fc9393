"""What the distribution installs: `sgl_blend` and its subpackages, and no top-level module that
another distribution could own (`server`, `kernels`, `bench`)."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"sgl_blend.server": ROOT / "server", "sgl_blend.kernels": ROOT / "kernels"}


def _declared() -> tuple[list[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools["packages"], setuptools["package-dir"]


def _on_disk() -> set[str]:
    found = set()
    for top, folder in {"sgl_blend": ROOT / "sgl_blend", **MAPPED}.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            found.add(".".join((top, *relative)))
    return found


def test_every_package_folder_is_declared_and_nothing_installs_at_top_level() -> None:
    packages, package_dir = _declared()
    assert set(packages) == _on_disk()
    assert {name.split(".")[0] for name in packages} == {"sgl_blend"}
    assert {name: ROOT / path for name, path in package_dir.items() if name != "sgl_blend"} == MAPPED


def test_the_batch_api_imports_only_under_its_package_name() -> None:
    top_level = subprocess.run([sys.executable, "-c", "import server"], cwd=ROOT, capture_output=True, text=True)
    assert top_level.returncode != 0
    assert "is the package sgl_blend.server" in top_level.stderr
    elsewhere = subprocess.run([sys.executable, "-c", "import sgl_blend.server.store, sgl_blend.kernels.profile"],
                               cwd=ROOT.parent, capture_output=True, text=True)
    assert elsewhere.returncode == 0, elsewhere.stderr
