"""How many prefill tokens an iteration may carry: the one rule the plugin and the simulator share.

With mixed prefill/decode batches (SGLang's ``--enable-mixed-chunk``) every running decode takes
one token of the chunk, so the prefill room is the chunk less the decodes; a policy that paces
prefill (BlendServe's Alg. 3 ``C_L + C_R``) lowers it further. Both engines call this, so what
the simulator measures is what the real scheduler is told to do.
"""

from __future__ import annotations


def prefill_room(chunk_tokens: int, decoding: int, paced_budget: int | None) -> int:
    """Prefill tokens for the next iteration: ``chunk - decodes``, capped by the policy's budget."""
    room = chunk_tokens - decoding
    if paced_budget is not None:
        room = min(room, paced_budget)
    return max(room, 0)
