"""The installed `sgl-blend` script, as a shell runs it: the one CLI test that needs a process of its
own, since its point is the console-script entry point (`sgl_blend.cli:main`'s return value
becoming the exit status). Every other CLI test calls `sgl_blend.cli.main` in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sgl_blend import __version__

SCRIPT = Path(sys.executable).with_name("sgl-blend")


def test_the_installed_script_runs_main_and_exits_with_its_status(tmp_path: Path) -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} is not installed: pip install -e ."
    version = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == f"sgl-blend {__version__}"
    refused = subprocess.run([str(SCRIPT), "models", "prepare", "gpt-5", "--cache-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "unknown model" in refused.stderr
