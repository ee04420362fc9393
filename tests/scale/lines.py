"""Batch lines in prefix families, for the scale-out tests: each family's lines share a long system
prompt, and even families ask for short answers (compute-heavy) while odd ones ask for long ones
(memory-heavy), so BlendServe's DP partition gives each slot whole families of both kinds."""

from __future__ import annotations

from typing import Any

TOPICS = ("rivers", "volcanoes", "glaciers", "deserts", "forests", "oceans")


def family_lines(families: int, per_family: int, short: int = 2, long: int = 16,
                 prefix: str = "fam") -> list[dict[str, Any]]:
    lines = []
    for family in range(families):
        max_tokens = long if family % 2 else short
        system = (f"You are a patient geography tutor who only talks about {TOPICS[family % len(TOPICS)]}. "
                  + "Answer briefly, cite one example, and never change the subject. " * 6)
        for member in range(per_family):
            lines.append({"custom_id": f"{prefix}{family}-{member}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "tiny-llama", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                   "messages": [{"role": "system", "content": system},
                                                {"role": "user", "content": f"Question number {member}."}]}})
    return lines


def family_of(custom_id: str) -> str:
    return custom_id.split("-", 1)[0]
