"""Named local models, where they live, and how each is built once.

A model directory is complete only when its marker file holds the recipe version: builds go to a
temporary sibling directory that is renamed into place, so an interrupted build never leaves a
half-written model that a later run would mistake for a finished one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SGLBLEND_CACHE_DIR"
_MARKER = ".sgl-blend-model"


@dataclass(frozen=True)
class LocalModel:
    name: str
    recipe_version: str
    build: Callable[[Path], None]
    description: str


def default_cache_dir() -> Path:
    """``$SGLBLEND_CACHE_DIR``, else ``$XDG_CACHE_HOME/sgl-blend``, else ``~/.cache/sgl-blend``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sgl-blend"


def _summary(doc: str | None) -> str:
    """The first line of a model module's docstring: the model's description."""
    return (doc or "").strip().splitlines()[0]


def _models() -> dict[str, LocalModel]:
    from sgl_blend.models import smollm2, stand_in, tiny_llama

    return {
        model.name: model
        for model in (
            LocalModel("tiny-llama", tiny_llama.RECIPE_VERSION, tiny_llama.build, _summary(tiny_llama.__doc__)),
            LocalModel("smollm2-135m", smollm2.RECIPE_VERSION, smollm2.build, _summary(smollm2.__doc__)),
            LocalModel(STAND_IN, stand_in.RECIPE_VERSION, stand_in.build, _summary(stand_in.__doc__)),
        )
    }


# The stand-in an emulated GPU server loads (`sgl_blend.emulation`); built after smollm2-135m, whose
# tokenizer it takes.
STAND_IN = "llama-stand-in"
MODEL_NAMES = ("tiny-llama", "smollm2-135m", STAND_IN)


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / name


def is_prepared(name: str, cache_dir: Path | None = None) -> bool:
    model = _models()[name]
    marker = model_dir(name, cache_dir) / _MARKER
    return marker.is_file() and marker.read_text().strip() == model.recipe_version


def prepare(name: str, cache_dir: Path | None = None) -> tuple[Path, bool]:
    """Build the named model if it is not already there. Returns its directory and whether it was built."""
    models = _models()
    if name not in models:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(models)}")
    target = model_dir(name, cache_dir)
    if is_prepared(name, cache_dir):
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        models[name].build(staging)
        (staging / _MARKER).write_text(models[name].recipe_version + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target, True


def resolve_model_path(name_or_path: str, cache_dir: Path | None = None) -> Path:
    """A bundled model's directory (built on first use), or the given path unchanged."""
    if name_or_path in MODEL_NAMES:
        return prepare(name_or_path, cache_dir)[0]
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a bundled model ({', '.join(MODEL_NAMES)}) nor an existing path"
        )
    return path
