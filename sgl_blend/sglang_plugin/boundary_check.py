"""Refuses to start the plugin on an SGLang that lacks anything `sglang_boundary` declares.

Half a plugin is worse than none: with a hook target renamed, SGLang's ``apply_hooks`` logs and
skips it, and the plugin runs with, say, its prefill adder but not the hook that reports
completions to the policy. So `require_boundary` checks the whole table first and refuses with
one message that names everything missing.

Why the refusal is a `SystemExit`: SGLang 0.5.23's ``load_plugins`` (``sglang/srt/plugins/
__init__.py``) calls each plugin's ``register()`` under ``except Exception``, logs what it catches
and goes on. `SGLangBoundaryError` is a ``SystemExit``, not an ``Exception``, so it passes through
and ends the first process that loads plugins (``sgl-blend serve``'s HTTP process, ``python -m
sglang.launch_server``, or the caller of ``sglang.Engine``) with the message on stderr, before any
scheduler is spawned.

How attributes are checked without an instance: a name is there if the class has it (methods,
properties, class attributes, enum members), declares it on itself or a base (annotations, so
dataclass and msgspec fields, and ``__slots__``), or if a method of the class or a base assigns it
as ``self.<name> = ...``. That last part reads the source, because SGLang sets most instance state
in methods (the scheduler in a dozen ``init_*`` methods spread over mixins): ``__init__`` alone
would miss most of it, and building a real scheduler or request to look at needs a model and a
device. A rename removes the assignment with the name, which is the case the check is for.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib.metadata
import inspect
import os
import pkgutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sgl_blend.sglang_plugin.sglang_boundary import (
    CALLS,
    HOOKS,
    NAMES,
    SUPPORTED_VERSION,
    SURFACES,
    Call,
    Hook,
    Surface,
)

# Test-only: one more dotted name the check requires, so a test can watch a real server refuse.
EXTRA_TARGET_ENV = "SGLBLEND_BOUNDARY_EXTRA_TARGET"
_MISSING = object()


class SGLangBoundaryError(SystemExit):
    """This SGLang is not the one the plugin was built against; the message says what differs."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_boundary(
    version: str | None = None,
    *,
    names: Mapping[str, str] = NAMES,
    hooks: Sequence[Hook] = HOOKS,
    calls: Sequence[Call] = CALLS,
    surfaces: Sequence[Surface] = SURFACES,
    targets: Iterable[str] = (),
) -> list[str]:
    """What this SGLang lacks of the declared boundary, one line each (empty: nothing).
    ``version`` stands in for the installed version; ``targets`` are more dotted names to require."""
    version = version or installed_version()
    if version is None:
        return [f"sglang is not installed (sgl-blend needs sglang=={SUPPORTED_VERSION})"]
    problems = (
        []
        if version == SUPPORTED_VERSION
        else [f"sglang {version} is installed; sgl-blend supports sglang=={SUPPORTED_VERSION} only"]
    )
    problems += [f"{path} (imported as {name}) {why}" for name, path in names.items() if (why := _unresolved(path))]
    problems += [f"{path} (required) {why}" for path in targets if (why := _unresolved(path))]
    for hook in hooks:
        problems += _call_problems(hook.target, hook.params, f"{hook.kind} hook: {hook.why}")
    for call in calls:
        problems += _call_problems(call.target, call.params, call.why)
    for surface in surfaces:
        problems += _surface_problems(surface)
    return problems


def refusal(problems: Sequence[str]) -> str:
    listed = "\n".join(f"  - {problem}" for problem in problems)
    return (
        f"sgl-blend refuses to start: the installed SGLang does not match the internals the plugin uses "
        f"(sgl_blend/sglang_plugin/sglang_boundary.py):\n{listed}\n"
        f"Install sglang=={SUPPORTED_VERSION}, the release sgl-blend is built against."
    )


def require_boundary(environ: Mapping[str, str] = os.environ) -> None:
    extra = environ.get(EXTRA_TARGET_ENV)
    problems = check_boundary(targets=[extra] if extra else ())
    if problems:
        raise SGLangBoundaryError(refusal(problems))


def _resolve(path: str) -> Any:
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError):
        return _MISSING


def _unresolved(path: str) -> str | None:
    """Why ``path`` does not resolve (None: it does)."""
    try:
        pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as error:
        return f"does not exist ({type(error).__name__}: {error})"
    return None


def _call_problems(target: str, params: str, why: str) -> list[str]:
    found = _resolve(target)
    if found is _MISSING:
        return [f"{target} ({why}) does not exist"]
    wanted = params.split()
    if not wanted:
        return []
    signature = inspect.signature(found)
    return [f"{target} ({why}) has no parameter {name!r}" for name in wanted if name not in signature.parameters]


def _surface_problems(surface: Surface) -> list[str]:
    cls = _resolve(surface.cls)
    if cls is _MISSING or not isinstance(cls, type):
        return [f"{surface.cls} ({surface.why}) does not exist"]
    return [
        f"{surface.cls} ({surface.why}) has no attribute {name!r}"
        for name in surface.attrs.split()
        if not _has_attribute(cls, name)
    ] + [
        f"{surface.cls} now has {name!r}, which the plugin sets for its own use"
        for name in surface.owned.split()
        if _has_attribute(cls, name)
    ]


def _has_attribute(cls: type, name: str) -> bool:
    """Whether ``cls`` or its instances have ``name``; bases are read only until it is found."""
    if hasattr(cls, name) or (issubclass(cls, enum.Enum) and any(hasattr(member, name) for member in cls)):
        return True
    return any(name in _declared(klass) for klass in cls.__mro__[:-1])


@functools.cache
def _declared(klass: type) -> frozenset[str]:
    """Instance attributes the class itself declares or assigns."""
    own = vars(klass)
    slots = own.get("__slots__", ())
    return frozenset(
        {*own.get("__annotations__", {}), *([slots] if isinstance(slots, str) else slots), *_assigned_on_self(klass)}
    )


def _assigned_on_self(klass: type) -> set[str]:
    """Names the class's own methods assign as ``<first parameter>.<name> = ...``."""
    node = _class_node(klass)
    if node is None:
        return set()
    found: set[str] = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        this = method.args.args[0].arg
        found.update(
            target.attr
            for target in ast.walk(method)
            if isinstance(target, ast.Attribute)
            and isinstance(target.ctx, ast.Store)
            and isinstance(target.value, ast.Name)
            and target.value.id == this
        )
    return found


def _class_node(klass: type) -> ast.ClassDef | None:
    try:
        path = inspect.getsourcefile(klass)
    except TypeError:
        return None
    if path is None:
        return None
    scope: ast.Module | ast.ClassDef = _module_ast(path)
    for part in klass.__qualname__.split("."):
        inner = next((node for node in scope.body if isinstance(node, ast.ClassDef) and node.name == part), None)
        if inner is None:
            return None
        scope = inner
    return scope if isinstance(scope, ast.ClassDef) else None


@functools.cache
def _module_ast(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())
