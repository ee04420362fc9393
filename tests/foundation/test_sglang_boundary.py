"""The SGLang boundary: the installed SGLang has everything the plugin declares; whatever is missing
is refused in one message that names it, and the refusal gets through SGLang's own plugin loader
and stops a real server; the plugin's code touches SGLang only through the declared table."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_blend.server import in_process
from sgl_blend.launch import supervisor
from sgl_blend.launch.supervisor import ServerStartError
from sgl_blend.sglang_plugin import sglang_boundary
from sgl_blend.sglang_plugin.boundary_check import (
    EXTRA_TARGET_ENV, SGLangBoundaryError, check_boundary, installed_version, require_boundary,
)
from sgl_blend.sglang_plugin.sglang_boundary import (
    ADDER_INIT, CALLS, HOOKS, SCHEDULER, SUPPORTED_VERSION, SURFACES, Call, Hook, Surface, argument,
)
from tests.conftest import free_port

PLUGIN = Path(sglang_boundary.__file__).parent
IN_PROCESS = Path(in_process.__file__)
BOUNDARY_MODULES = {"sglang_boundary.py", "boundary_check.py"}
BOGUS = f"{SCHEDULER}.Scheduler.no_such_method"


def plugin_sources() -> dict[Path, ast.Module]:
    """The plugin's modules, and the batch runner's in-process path, which calls SGLang's handlers."""
    paths = [*sorted(PLUGIN.rglob("*.py")), IN_PROCESS]
    return {path: ast.parse(path.read_text(), str(path)) for path in paths if path.name not in BOUNDARY_MODULES}


def test_the_installed_sglang_has_everything_the_plugin_uses() -> None:
    assert installed_version() == SUPPORTED_VERSION
    assert check_boundary() == []


def test_everything_missing_is_named_in_one_refusal() -> None:
    problems = check_boundary(
        "0.5.24",
        hooks=(*HOOKS, Hook(BOGUS, "AFTER", "", "a renamed hook target")),
        calls=(*CALLS, Call(ADDER_INIT.target, "rem_chunk_tokens chunk_budget", "a renamed parameter")),
        surfaces=(*SURFACES, Surface(f"{SCHEDULER}.Scheduler", "waiting_queue pending_queue", "scheduler",
                                     "a renamed attribute", owned="tree_cache")),
        targets=["sglang.srt.no_such_module.Thing"])
    assert problems[0] == "sglang 0.5.24 is installed; sgl-blend supports sglang==0.5.23 only"
    assert problems[1].startswith("sglang.srt.no_such_module.Thing (required) does not exist")
    assert problems[2:] == [
        f"{BOGUS} (AFTER hook: a renamed hook target) does not exist",
        f"{ADDER_INIT.target} (a renamed parameter) has no parameter 'chunk_budget'",
        f"{SCHEDULER}.Scheduler (a renamed attribute) has no attribute 'pending_queue'",
        f"{SCHEDULER}.Scheduler now has 'tree_cache', which the plugin sets for its own use",
    ]
    with pytest.raises(SGLangBoundaryError) as refused:
        require_boundary({EXTRA_TARGET_ENV: BOGUS})
    assert not isinstance(refused.value, Exception), "SGLang's plugin loader swallows every Exception"
    message = str(refused.value.code)
    assert message.startswith("sgl-blend refuses to start") and f"  - {BOGUS} (required) does not exist" in message
    assert message.count("\n  - ") == 1 and message.endswith(f"Install sglang=={SUPPORTED_VERSION}, the release "
                                                              "sgl-blend is built against.")


def test_sglang_arguments_are_read_by_name() -> None:
    chunk, mixed = argument(ADDER_INIT, "rem_chunk_tokens"), argument(ADDER_INIT, "num_mixed_decode_tokens")
    positional = ("adder", 1, "tree_cache", "allocator", "running_batch", 1.0, 4096, 512, 16)
    assert (chunk.read(positional, {}), mixed.read(positional, {})) == (512, 16)
    keywords = ("adder", 1, "tree_cache", "allocator", "running_batch", 1.0, 4096)
    assert (chunk.read(keywords, {"rem_chunk_tokens": None}), mixed.read(keywords, {})) == (None, 0)
    assert chunk.replaced(positional, {}, 64)[0][7] == 64
    assert chunk.replaced(keywords, {}, 64)[1] == {"rem_chunk_tokens": 64}


def test_sglang_plugin_loader_lets_the_refusal_through() -> None:
    """SGLang's ``load_plugins`` logs and swallows a plugin's exceptions; the refusal ends the
    process that loads plugins, with the message, and nothing after it runs."""
    loaded = subprocess.run([sys.executable, "-c", "from sglang.srt.plugins import load_plugins\n"
                             "load_plugins()\nprint('went on')"],
                            env={**os.environ, EXTRA_TARGET_ENV: BOGUS}, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 1 and "went on" not in loaded.stdout
    assert f"sgl-blend refuses to start" in loaded.stderr and BOGUS in loaded.stderr


@pytest.mark.server
def test_a_server_on_a_mismatched_sglang_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXTRA_TARGET_ENV, BOGUS)
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError, match="exited with code 1"):
        supervisor.start_server("tiny-llama", ["--port", str(free_port())], log_path=log, ready_timeout_s=300)
    text = log.read_text()
    assert "sgl-blend refuses to start" in text and f"{BOGUS} (required) does not exist" in text


def test_the_plugin_imports_sglang_only_through_the_boundary() -> None:
    for path, tree in plugin_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(alias.name.split(".")[0] == "sglang" for alias in node.names), path
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "sglang", f"{path}:{node.lineno}"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith("sglang."), f"{path}:{node.lineno}: an undeclared SGLang target"
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sgl"):
                assert node.attr in sglang_boundary.NAMES or node.attr in vars(sglang_boundary), (
                    f"{path}:{node.lineno}: sgl.{node.attr} is not in the boundary table")


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; a call in the chain keeps its name with ``()``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else [*base, node.attr]
    if isinstance(node, ast.Call):
        base = _dotted(node.func)
        return None if base is None else [*base[:-1], base[-1] + "()"]
    return None


def _touched(tree: ast.Module) -> list[tuple[list[str], int]]:
    """Every attribute chain in the code, with ``getattr(x, "name", ...)`` read as ``x.name``."""
    chains = []
    for node in ast.walk(tree):
        chain = None
        if isinstance(node, ast.Attribute):
            chain = _dotted(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            base = _dotted(node.args[0])
            chain = None if base is None else [*base, node.args[1].value]
        if chain is not None:
            chains.append((chain, node.lineno))
    return chains


def test_every_attribute_the_plugin_touches_on_sglang_objects_is_declared() -> None:
    """Each SGLang object the plugin's code reaches by a declared name (``reached``: ``req``,
    ``req.kv``, ``scheduler.token_to_kv_pool_allocator``, ...) is only read or written through
    attributes its row declares. Methods of the plugin's own subclasses (``self``) are listed by
    hand."""
    by_reach = {reach: surface for surface in SURFACES for reach in surface.reached.split()}
    undeclared = []
    for path, tree in plugin_sources().items():
        for chain, line in _touched(tree):
            for length in range(len(chain) - 1, 0, -1):
                surface = by_reach.get(".".join(chain[:length]))
                if surface is not None:
                    if chain[length] not in {*surface.attrs.split(), *surface.owned.split()}:
                        undeclared.append(f"{path.name}:{line}: {'.'.join(chain[:length + 1])}")
                    break
    assert not undeclared, "SGLang attributes missing from sglang_boundary.SURFACES:\n" + "\n".join(undeclared)
