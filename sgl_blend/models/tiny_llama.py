"""A random-weight Llama (2 layers, hidden 64) with an offline-trained BPE tokenizer, for fast tests.

Its weights are seeded and its tokenizer is trained on CPython's own documentation text
(``pydoc_data.topics``), which every Python installation carries, so the model is byte-identical on
any machine and never needs a download. Its text is gibberish; its shapes and its prefix-cache
behaviour are what tests need.
"""

from __future__ import annotations

import json
from pathlib import Path

RECIPE_VERSION = "tiny-llama-v1"
VOCAB_SIZE = 1024
SEED = 0
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|begin|>", "<|end|>", "<|pad|>"]


def _training_text() -> list[str]:
    from pydoc_data.topics import topics

    return list(topics.values())


def _build_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)


def build(directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _build_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, indent=2)
    )
