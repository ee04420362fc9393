"""Session-wide fixtures (one real tiny-llama SGLang server for every test that needs one) and the
two test tiers.

Every test that starts a real server -- SGLang, the Batch API, or a `run-batch` job that launches
one -- is marked ``server`` at collection: ``pytest -m "not server"`` is the fast tier. A test is
a server test when its own source, the source of a fixture it uses, or a function of the same
module that either of them calls (directly or through others) starts a server. A test that still
starts one in this process without the mark fails, naming itself, so none slips into the fast tier.
"""

from __future__ import annotations

import inspect
import re
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

from sgl_blend.launch import supervisor
from sgl_blend.launch.colocation import free_port
from sgl_blend.launch.supervisor import ServerProcess

SERVER = "server"
# What starting a real server looks like in a test's source: the supervisor, the helpers built on
# it, or a `python -m sgl_blend.cli run-batch` / `serve` process (which launches its own).
_STARTS_SERVER = re.compile(r"\b(?:start_server|start_batch_server|run_on_fresh_server|launch)\("
                            r"|[\"']sgl_blend\.cli[\"'],\s*[\"'](?:run-batch|serve)[\"']")


def launch(model: str, log_dir: Path, *sglang_args: str) -> ServerProcess:
    """Start a real server on a free port, logging to a file the failure message points at."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return supervisor.start_server(model, ["--port", str(free_port()), *sglang_args],
                                   log_path=log_dir / f"{model}-server.log")


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = launch("tiny-llama", tmp_path_factory.mktemp("tiny-server"), "--enable-cache-report")
    yield server
    server.stop()


# The tiers

def _source(function: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


@lru_cache(maxsize=None)
def _server_starters(module: ModuleType) -> frozenset[str]:
    """Names of the module's own functions that start a server, directly or through each other."""
    sources = {name: _source(value) for name, value in vars(module).items()
               if inspect.isfunction(value) and value.__module__ == module.__name__}
    starters = {name for name, text in sources.items() if _STARTS_SERVER.search(text)}
    while True:
        calls = re.compile(r"\b(?:" + "|".join(map(re.escape, starters)) + r")\(") if starters else None
        more = {name for name, text in sources.items() if name not in starters and calls and calls.search(text)}
        if not more:
            return frozenset(starters)
        starters |= more


def _starts_server(function: Callable[..., Any]) -> bool:
    function = inspect.unwrap(function)
    text = _source(function)
    if _STARTS_SERVER.search(text):
        return True
    module = sys.modules.get(getattr(function, "__module__", ""))
    starters = _server_starters(module) if module is not None else frozenset()
    return any(re.search(rf"\b{re.escape(name)}\(", text) for name in starters)


def _is_server_test(item: pytest.Item) -> bool:
    functions = [item.function] if isinstance(item, pytest.Function) else []
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for definition in (info.name2fixturedefs.get(name, ()) if info is not None else ()):
            functions.append(definition.func)
    return any(_starts_server(function) for function in functions)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(SERVER) is None and _is_server_test(item):
            item.add_marker(SERVER)


_running: pytest.Item | None = None
_start_server = supervisor.start_server


def _start_server_in_a_server_test(*args: Any, **kwargs: Any) -> ServerProcess:
    if _running is not None and _running.get_closest_marker(SERVER) is None:
        pytest.fail(f"{_running.nodeid} starts a real server but is not marked `{SERVER}`: the collection hook in "
                    "tests/conftest.py did not see it (mark the test or its module with pytest.mark.server)")
    return _start_server(*args, **kwargs)


# Test modules import `start_server` after this conftest, so they get the checked one.
supervisor.start_server = _start_server_in_a_server_test


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _running
    _running = item


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    global _running
    _running = None
