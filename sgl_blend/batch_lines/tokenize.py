"""Batch lines as the planner and the DP partitioner see them: prompt token ids and an
output-length bound.

Planning a batch and placing its lines on DP ranks (or servers) need their prompts as the engine
will see them, so that lines sharing a prefix share a subtree: chat lines go through the model's
own chat template, completion and embedding lines through its tokenizer. A prompt that cannot be
tokenised (an unusual content shape, a template error) still gets placed, with its text's tokens
or none at all: placement only decides where a line runs, never whether it runs.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sgl_blend.batch_lines.lines import BatchLine
from sgl_blend.core.output_length import DEFAULT_FALLBACK

logger = logging.getLogger(__name__)
# Prompts are kept as int32 token ids; a line's id outside that range is no token of any model.
TOKEN_ID_LIMIT = 2**31


class LineTokenizer:
    """The model's tokenizer (loaded once, on first use) applied to batch line bodies."""

    def __init__(self, model_path: str | Path) -> None:
        self.model_path = str(model_path)
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def prompt_ids(self, line: BatchLine) -> list[int]:
        body = line.body
        try:
            if line.url == "/v1/chat/completions":
                return self._chat_ids(body.get("messages"))
            return self._text_ids(body.get("prompt") if line.url == "/v1/completions" else body.get("input"))
        except Exception as error:  # a template or tokenizer error on odd content: place it anyway
            logger.debug("line %d: tokenising its prompt failed (%s); placing it by its text", line.line_number, error)
            return self._text_ids(json.dumps(body, ensure_ascii=False, sort_keys=True))

    def prompt_ids_batch(self, lines: Sequence[BatchLine]) -> list[list[int]]:
        """Every line's prompt ids, with one batched call of the fast tokenizer: chat lines are
        rendered by the chat template as text first. A line the batch cannot take (odd content,
        token-id prompts) goes through `prompt_ids` alone."""
        texts: list[str | None] = []
        for line in lines:
            try:
                texts.append(self._prompt_text(line))
            except Exception:  # a template error on odd content: tokenised alone below
                texts.append(None)
        batch = [text for text in texts if text is not None]
        encoded = iter(self.tokenizer(batch, add_special_tokens=False)["input_ids"] if batch else [])
        return [list(next(encoded)) if text is not None else self.prompt_ids(line) for line, text in zip(lines, texts)]

    def _prompt_text(self, line: BatchLine) -> str | None:
        body = line.body
        if line.url == "/v1/chat/completions":
            text = self.tokenizer.apply_chat_template(body.get("messages"), add_generation_prompt=True, tokenize=False)
            return text if isinstance(text, str) else None
        prompt = body.get("prompt") if line.url == "/v1/completions" else body.get("input")
        if isinstance(prompt, str):
            return self._bos_text + prompt
        return None

    @functools.cached_property
    def _bos_text(self) -> str:
        """The BOS token's text if the tokenizer adds one to a plain prompt, else empty: the batch
        encodes without special tokens, so it is put in front of completion prompts by hand."""
        ids = self.tokenizer.encode("a", add_special_tokens=True)
        adds = bool(ids) and ids[0] == self.tokenizer.bos_token_id
        return (self.tokenizer.bos_token or "") if adds else ""

    def _chat_ids(self, messages: Any) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(token) for token in ids]

    def _text_ids(self, prompt: Any) -> list[int]:
        """A string, a token id list, or (several prompts) the first of a list of either."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
            return [token for token in prompt if 0 <= token < TOKEN_ID_LIMIT]
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        return []


def output_bound(body: dict[str, Any]) -> tuple[int, bool]:
    """A line's output-length bound and whether it is exact (``ignore_eos`` with a bound)."""
    bound = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(bound, int) and bound > 0:
        return bound, bool(body.get("ignore_eos"))
    return DEFAULT_FALLBACK, False
