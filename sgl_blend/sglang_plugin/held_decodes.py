"""Decode requests held out of SGLang's running batch with their KV resident, and put back later.

SGLang decodes every request of its running batch each iteration; the only ways it knows to stop
one are to finish it or to retract it (free its KV and recompute prompt and output later). A
scheduling mode that wants a decode to sit out some iterations (BROS's Alg. 1 leaving a
best-effort decode out of the batch, HyGen/Echo skipping an offline decode) holds it here
instead: the request leaves the running batch through SGLang's own ``filter_batch`` and keeps
everything it owns -- its ``req_to_token`` row, its KV slots and, with the radix cache on, the
lock refs on its prefix (``req.lock``), which nothing here touches. Putting it back builds a
decode batch for it the way SGLang builds one for requests that come back from hierarchical
sparse staging (``Scheduler._build_hisparse_decode_batch``: row indices, sequence lengths from
the request, its last token stashed in the future map, sampling info from the request) and
merges it with ``merge_batch``, or makes it the running batch when that is empty. Penalizers that
count output tokens (frequency, presence, repetition, min-new-tokens) start empty in a new batch,
so the request's output so far is fed to them again, token by token as decoding had.

Nothing may be lost:

- a held request that its client aborts is not in any batch SGLang's ``abort_request`` looks at,
  so `abort` frees it the way SGLang frees an aborted chunked prefill (``release_kv_cache``
  without caching, abort output to the tokenizer);
- with the overlap scheduler a request may be held while its last decode is still in flight; it
  is not put back until that result is processed (`in_flight`), and if that result finishes it,
  SGLang releases it there and `sweep` forgets it;
- SGLang must not think itself idle while requests are held (it would check the KV pool for
  leaks and sleep): the plugin's ``is_fully_idle`` hook asks `any`;
- what is held is counted in ``/server_info`` (`snapshot`: requests, resident tokens, holds,
  resumes, aborts).

Speculative decoding, beam search and encoder-decoder models keep per-request state in the batch
that this does not rebuild, so their requests are never held (`holdable`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sgl_blend.sglang_plugin import sglang_boundary as sgl


def resident_tokens(req: Any) -> int:
    """KV slots the request owns and keeps while held: everything it has computed past the prefix
    the radix cache holds for it."""
    return int(req.kv.kv_committed_len - req.kv.cache_protected_len)


def holdable(scheduler: Any, req: Any) -> bool:
    return (
        scheduler.spec_algorithm.is_none()
        and not scheduler.model_config.is_encoder_decoder
        and req.beam_group is None
        and not req.finished()
        and req.kv.holds_kv
        and req is not scheduler.chunked_req
    )


def in_flight(scheduler: Any) -> set[int]:
    """Ids of the requests in a batch whose result the overlap scheduler has not processed yet."""
    return {id(req) for batch, _ in getattr(scheduler, "result_queue", ()) for req in batch.reqs}


class HeldDecodes:
    def __init__(self) -> None:
        self._held: dict[str, Any] = {}
        self.counts = {"holds": 0, "resumes": 0, "aborted": 0, "finished_while_held": 0}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, rid: str) -> bool:
        return rid in self._held

    def any(self) -> bool:
        return bool(self._held)

    def requests(self) -> list[Any]:
        """The held requests, oldest hold first."""
        return list(self._held.values())

    def get(self, rid: str) -> Any | None:
        return self._held.get(rid)

    def holds(self, req: Any) -> bool:
        """Whether ``req`` itself is held (not another request under its rid)."""
        return self._held.get(req.rid) is req

    def tokens(self) -> int:
        return sum(resident_tokens(req) for req in self._held.values())

    def snapshot(self) -> dict[str, Any]:
        return {"held_now": len(self._held), "held_tokens": self.tokens(), "held_rids": list(self._held), **self.counts}

    def hold(self, scheduler: Any, batch: Any, reqs: Iterable[Any]) -> list[Any]:
        """Take ``reqs`` out of the running ``batch`` (in place) with their KV resident; returns
        those held (requests not in the batch or not `holdable` stay where they are)."""
        wanted = {id(req) for req in reqs if holdable(scheduler, req)}
        held = [req for req in batch.reqs if id(req) in wanted]
        if not held:
            return []
        batch.filter_batch(keep_indices=[i for i, req in enumerate(batch.reqs) if id(req) not in wanted])
        batch.batch_is_full = False
        for req in held:
            self._held[req.rid] = req
        self.counts["holds"] += len(held)
        return held

    def resumable(self, scheduler: Any, req: Any) -> bool:
        """Whether ``req`` can be put back now: held, unfinished, no result of it in flight, and
        every token it has computed resident (`kv_checkpoint` may have copied some to host)."""
        return (
            self.holds(req)
            and not req.finished()
            and id(req) not in in_flight(scheduler)
            and req.kv.kv_committed_len == len(req.origin_input_ids) + len(req.output_ids) - 1
        )

    def resume(self, scheduler: Any, running_batch: Any, reqs: Iterable[Any]) -> Any:
        """Put ``reqs`` back into the running batch; returns the running batch to use (a new one
        when ``running_batch`` was empty). Requests that are not `resumable` stay held."""
        back = [req for req in reqs if self.resumable(scheduler, req)]
        if not back:
            return running_batch
        for req in back:
            del self._held[req.rid]
        self.counts["resumes"] += len(back)
        batch = _decode_batch(scheduler, back)
        if running_batch.is_empty():
            batch.batch_is_full = running_batch.batch_is_full
            return batch
        running_batch.merge_batch(batch)
        return running_batch

    def release(self, rid: str) -> Any | None:
        """Stop holding ``rid`` without putting it back: the caller takes over its KV (retracts it)."""
        return self._held.pop(rid, None)

    def sweep(self) -> list[Any]:
        """Forget held requests that finished meanwhile (their in-flight result finished them and
        SGLang released their KV); returns them."""
        done = [req for req in self._held.values() if req.finished()]
        for req in done:
            del self._held[req.rid]
        self.counts["finished_while_held"] += len(done)
        return done

    def abort(self, scheduler: Any, rid: str, abort_all: bool, finished_reason: Any = None) -> list[Any]:
        """SGLang's ``abort_request`` for held requests (``rid`` is a prefix, as there): one with a
        result in flight is marked to finish, which that result does, as SGLang marks a running
        request; any other is freed now. Returns the requests freed now."""
        flying = in_flight(scheduler)
        freed = []
        for req in [req for req in self._held.values() if abort_all or req.rid.startswith(rid)]:
            if req.finished():
                continue
            if id(req) in flying:
                req.to_finish = sgl.FINISH_ABORT()
                continue
            del self._held[req.rid]
            sgl.prepare_abort(req, "Aborted")
            scheduler._release_aborted_request(req)
            sgl.release_kv_cache(req, scheduler.tree_cache, checkpoint=False)
            scheduler.send_abort_output(sgl.make_abort_req(req, finished_reason=finished_reason), req)
            freed.append(req)
        self.counts["aborted"] += len(freed)
        return freed


def _decode_batch(scheduler: Any, reqs: list[Any]) -> Any:
    """One decode batch for requests whose KV is resident: one built per request (so each one's
    penalizers can be replayed alone), merged as SGLang merges batches."""
    batch = _request_batch(scheduler, reqs[0])
    for req in reqs[1:]:
        batch.merge_batch(_request_batch(scheduler, req))
    return batch


def _request_batch(scheduler: Any, req: Any) -> Any:
    """A one-request decode batch, as ``_build_hisparse_decode_batch`` builds one (with the
    multimodal and logprob fields a prefill batch takes from the request). The penalizers that count output
    tokens are fed every output token but the last, one at a time as ``prepare_for_decode`` fed
    them while the request ran; the next ``prepare_for_decode`` adds the last one."""
    import torch

    device = scheduler.device
    batch = sgl.ScheduleBatch.init_new(
        reqs=[req],
        req_to_token_pool=scheduler.req_to_token_pool,
        token_to_kv_pool_allocator=scheduler.token_to_kv_pool_allocator,
        tree_cache=scheduler.tree_cache,
        model_config=scheduler.model_config,
        enable_overlap=scheduler.enable_overlap,
        spec_algorithm=scheduler.spec_algorithm,
    )
    seq_len = int(req.kv.kv_committed_len)
    batch.req_pool_indices = torch.tensor([req.kv.req_pool_idx], dtype=torch.int64, device=device)
    batch.req_pool_indices_cpu = torch.tensor([req.kv.req_pool_idx], dtype=torch.int64)
    batch.seq_lens = torch.tensor([seq_len], dtype=torch.int64, device=device)
    batch.seq_lens_cpu = torch.tensor([seq_len], dtype=torch.int64)
    batch.orig_seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
    batch.seq_lens_sum = seq_len
    last_token = torch.tensor([req.output_ids[-1]], dtype=torch.int64, device=device)
    scheduler.future_map.stash(batch.req_pool_indices, sgl.RelayPayload(bonus_tokens=last_token))
    batch.input_ids = None
    batch.multimodal_inputs = [req.multimodal_inputs]
    if batch.return_logprob:
        batch.top_logprobs_nums = [req.logprob.top_logprobs_num]
        batch.token_ids_logprobs = [req.logprob.token_ids_logprob]
    batch.sampling_info = sgl.SamplingBatchInfo.from_schedule_batch(batch, scheduler.model_config.vocab_size)
    orchestrator = batch.sampling_info.penalizer_orchestrator
    if orchestrator is not None and orchestrator.is_required:
        for token in req.output_ids[:-1]:
            orchestrator.cumulate_output_tokens(torch.tensor([token], dtype=torch.int64, device=device))
    return batch
