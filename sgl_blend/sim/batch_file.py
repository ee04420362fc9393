"""A batch file as the simulator's requests, read as the emulated engine reads it.

Each runnable line's prompt is tokenised once with the tokenizer the engine serves (for an
emulated model such as ``llama-3.1-8b``, the stand-in's: SmolLM2's), chat lines through its chat
template (`LineTokenizer`), and the prompts' prefix tree gives each request its shared segments
(`workload.requests_from_prompts`). Output lengths are the lines' bounds (`output_bound`): exact for
``ignore_eos`` lines, and what the emulated engine runs for the others too, since its stand-in
forward never emits an end-of-sequence token; a line without ``max_tokens`` takes the planner's
fallback. Lines that fail to parse run nowhere and are only counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sgl_blend.batch_lines.lines import BatchLine, read_lines
from sgl_blend.batch_lines.tokenize import LineTokenizer, output_bound
from sgl_blend.models.llama31 import EMULATION_MODELS
from sgl_blend.models.registry import STAND_IN, prepare, resolve_model_path
from sgl_blend.sim.workload import SimRequest, requests_from_prompts


@dataclass(frozen=True)
class BatchFile:
    """``requests`` in file order; ``invalid``: lines that would fail; ``unbounded``: lines without
    ``max_tokens``, priced at the fallback bound."""

    requests: list[SimRequest]
    invalid: int
    unbounded: int


def served_tokenizer(model: str) -> Path:
    """The directory whose tokenizer the engine serving ``model`` uses: the stand-in's for a model
    that is only emulated, the model's own otherwise."""
    return prepare(STAND_IN)[0] if model in EMULATION_MODELS else resolve_model_path(model)


def load_batch_file(path: Path, model: str) -> BatchFile:
    lines = list(read_lines(path))
    runnable = [line for line in lines if isinstance(line, BatchLine)]
    prompts = LineTokenizer(served_tokenizer(model)).prompt_ids_batch(runnable)
    outputs = []
    unbounded = 0
    for line in runnable:
        bound, exact = output_bound(line.body)
        unbounded += not (line.body.get("max_completion_tokens") or line.body.get("max_tokens"))
        outputs.append((bound, bound, exact))
    requests = requests_from_prompts([line.custom_id for line in runnable], prompts, outputs)
    return BatchFile(requests, len(lines) - len(runnable), unbounded)
