"""A random-weight tiny Llama with SmolLM2's tokenizer: what an emulated GPU server really loads.

An emulated server skips the model forward and prices it at a named model's shapes
(`llama31.EMULATION_MODELS`), so the weights it loads only have to be small; the tokenizer is what
decides prompt lengths, and SmolLM2's 49,152-token BPE counts English text close to Llama 3's
tokenizer, where tiny-llama's 1,024-token BPE would make every prompt several times longer. The
context length is Llama 3.1's, so SGLang's own limits (request length, the running-request
estimate) are the ones a server of the named model has.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaConfig

RECIPE_VERSION = "llama-stand-in-v1"
TOKENIZER_SOURCE = "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CONTEXT_LENGTH = 131072
SEED = 0
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


TINY_SHAPES: Mapping[str, int] = MappingProxyType(
    {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
)


def build(directory: Path) -> None:
    """Build into ``directory``, a staging folder beside the finished models (see `registry`),
    whose own cache holds SmolLM2 once it is prepared."""
    import torch
    from transformers import LlamaForCausalLM

    from sgl_blend.models.registry import prepare

    source, _ = prepare(TOKENIZER_SOURCE, directory.parent.parent)
    config = write_config(directory, source, TINY_SHAPES)
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)


def write_config(directory: Path, source: Path, shapes: Mapping[str, Any], dtype: str = "float32") -> LlamaConfig:
    """A Llama of ``shapes`` with the tokenizer, vocabulary size and special tokens of ``source``
    (SmolLM2's directory, or any copy of its tokenizer files and config), into ``directory``: its
    config, tokenizer and generation config, no weights. `build` adds the tiny stand-in's weights;
    the GPU check (``bench.gpu_check``) writes Llama-3.1-8B's shapes this way and lets SGLang draw
    random weights on the GPU (``--load-format dummy``), where 16 GB of safetensors would cost
    minutes of a short device lease to write and read back."""
    from transformers import LlamaConfig

    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, directory / name)
    smollm2 = json.loads((source / "config.json").read_text())
    special = {key: smollm2[key] for key in SPECIAL_TOKENS}
    config = LlamaConfig(
        **{
            "vocab_size": smollm2["vocab_size"],
            "max_position_embeddings": CONTEXT_LENGTH,
            "tie_word_embeddings": False,
            **shapes,
        },
        dtype=dtype,
        # save_pretrained of a model records its class here; SGLang picks the model class by it.
        architectures=["LlamaForCausalLM"],
        **special,
    )
    config.save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps(special, indent=2))
    return config
