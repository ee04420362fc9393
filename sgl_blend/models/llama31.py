"""The Llama-3.1 shapes an emulated GPU prices: the published ``config.json`` values, no weights.

An emulated server (`sgl_blend.emulation`) runs a tiny stand-in model (`stand_in`) but prices every
forward, and sizes its KV pool, as if these models ran. Only the fields that decide cost or memory
are kept, with the values of Meta's ``meta-llama/Llama-3.1-8B`` and ``-70B`` configs; the 8B and 70B
share the tokenizer, vocabulary and 131,072-token context.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "head_dim": 128,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

LLAMA_31_8B = MappingProxyType(
    {**_COMMON, "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32}
)
LLAMA_31_70B = MappingProxyType(
    {**_COMMON, "num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64}
)

# The names `sgl-blend serve --emulate DEVICE --model NAME` accepts; the same names as the cost
# model's built-in `ModelSpec`s, so an emulated run and `sgl-blend sim --model NAME` price alike.
EMULATION_MODELS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "llama-3.1-8b": LLAMA_31_8B,
        "llama-3.1-70b": LLAMA_31_70B,
    }
)
