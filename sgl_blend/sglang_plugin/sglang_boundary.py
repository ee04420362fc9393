"""Every SGLang internal the plugin touches, in one table that `register` checks before anything starts.

The plugin hooks private methods of SGLang's scheduler by dotted name, subclasses its prefill adder
and radix cache, and reads and writes attributes of its scheduler, requests, batches, caches and
pools. None of that is public API. Unchecked, a release that renames one of them switches part of
the plugin off in silence (SGLang's ``apply_hooks`` only logs a target it cannot find) or fails
mid-iteration. So each one is declared here with why the plugin needs it, and `boundary_check`
refuses to start on an SGLang where any is missing.

How the plugin uses the table: it names SGLang's classes and functions through this module
(``from sgl_blend.sglang_plugin import sglang_boundary as sgl``, then ``sgl.PrefillAdder``), never
through ``sglang`` itself; a name is resolved on first use, so importing the plugin still does not
import SGLang. It registers hooks with `register_hook` and a `Hook` row, and reads the arguments
SGLang passes by name (`argument`, found once per call site), never by a position it assumed.
``reached`` says how the plugin's code names an object
(``req.kv`` is a `ReqKvInfo`); ``owned`` lists attributes the plugin itself sets on SGLang's
objects, which SGLang must not define. The launcher (`sgl_blend.launch.http_process`) imports
SGLang's server entry points directly: a rename there fails loudly at start-up already.

The emulated GPU (`sgl_blend.emulation`) enters SGLang through this table too: the plugin hands
this module to it (`sgl_blend.emulation.sglang_forward.register`), since the plugin imports the
emulation package and the emulation cannot import the plugin back.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SUPPORTED_VERSION = "0.5.23"

SCHEDULER = "sglang.srt.managers.scheduler"
POLICY = "sglang.srt.managers.schedule_policy"
BATCH = "sglang.srt.managers.schedule_batch"
CACHE = "sglang.srt.mem_cache"
STATE = "sglang.srt.managers.scheduler_components.internal_state"
IO = "sglang.srt.managers.io_struct"
SERVING = "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase"
AUTH = "sglang.srt.utils.auth"


@dataclass(frozen=True)
class Hook:
    """A `HookRegistry` hook: ``kind`` is a ``HookType`` name; ``params`` the target's parameters
    the hook reads by name."""

    target: str
    kind: str
    params: str
    why: str


@dataclass(frozen=True)
class Call:
    """An SGLang callable the plugin calls (or overrides) with ``params`` named."""

    target: str
    params: str
    why: str


@dataclass(frozen=True)
class Surface:
    """An SGLang class and the attributes the plugin reads or writes on it or its instances;
    ``reached``: the expressions the plugin's code reaches such an object by."""

    cls: str
    attrs: str
    reached: str
    why: str
    owned: str = ""


# SGLang names the plugin uses, as ``sgl.<name>``.
NAMES: dict[str, str] = {
    "HookRegistry": "sglang.srt.plugins.hook_registry.HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry.HookType",
    "PrefillAdder": f"{POLICY}.PrefillAdder",
    "AddReqResult": f"{POLICY}.AddReqResult",
    "CLIP_MAX_NEW_TOKENS": f"{POLICY}.CLIP_MAX_NEW_TOKENS",
    "IGNORE_EOS_RESERVE_TOKENS": f"{POLICY}.IGNORE_EOS_RESERVE_TOKENS",
    "ScheduleBatch": f"{BATCH}.ScheduleBatch",
    "FINISH_ABORT": f"{BATCH}.FINISH_ABORT",
    "make_abort_req": f"{SCHEDULER}._make_abort_req",
    "prepare_abort": "sglang.srt.disaggregation.utils.prepare_abort",
    "RelayPayload": "sglang.srt.managers.overlap_utils.RelayPayload",
    "SamplingBatchInfo": "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo",
    "release_kv_cache": f"{CACHE}.common.release_kv_cache",
    "evict_from_tree_cache": f"{CACHE}.common.evict_from_tree_cache",
    "match_kv_cache": f"{CACHE}.common.match_kv_cache",
    "RadixCache": f"{CACHE}.radix_cache.RadixCache",
    "EvictionStrategy": f"{CACHE}.evict_policy.EvictionStrategy",
    "register_radix_cache_backend": f"{CACHE}.registry.register_radix_cache_backend",
    "get_radix_cache_factory": f"{CACHE}.registry.get_radix_cache_factory",
    "UpdateRejected": f"{STATE}.UpdateRejected",
    "UpdateHandler": f"{STATE}._UpdateHandler",
    "get_parallel": "sglang.srt.runtime_context.get_parallel",
    "get_server_args": "sglang.srt.runtime_context.get_server_args",
    "GenerationBatchResult": "sglang.srt.managers.utils.GenerationBatchResult",
    "monotonic_time": "sglang.srt.observability.req_time_stats.monotonic_time",
    "DS32EncodingError": "sglang.srt.entrypoints.openai.encoding_dsv32.DS32EncodingError",
    "LogitsProcessorOutput": "sglang.srt.layers.logits_processor.LogitsProcessorOutput",
    "route_auth_level": f"{AUTH}._get_auth_level_from_app_and_scope",
}

# Where the plugin enters SGLang (`hooks`, `internal_state`).
CALC_PRIORITY = Hook(
    f"{POLICY}.SchedulePolicy.calc_priority",
    "AROUND",
    "waiting_queue",
    "online first, offline work in the policy's order",
)
PREFILL_ADDER_CLASS = Hook(
    f"{SCHEDULER}.Scheduler.get_prefill_adder_class",
    "REPLACE",
    "",
    "SGLang builds prefill batches with the plugin's adder",
)
NEW_PREFILL_BATCH = Hook(
    f"{SCHEDULER}.Scheduler._get_new_batch_prefill_raw",
    "AROUND",
    "running_batch",
    "the mode plans before a prefill batch and puts held decodes back; returns (batch or None, running batch)",
)
UPDATE_RUNNING_BATCH = Hook(
    f"{SCHEDULER}.Scheduler.update_running_batch", "AROUND", "batch", "the mode plans before a decode batch"
)
RUN_BATCH = Hook(f"{SCHEDULER}.Scheduler.run_batch", "AROUND", "batch", "per-iteration record, forward time")
PROCESS_BATCH_RESULT = Hook(
    f"{SCHEDULER}.Scheduler.process_batch_result", "AFTER", "batch", "progress and completions to the policy"
)
ADD_REQUEST_TO_QUEUE = Hook(
    f"{SCHEDULER}.Scheduler._add_request_to_queue",
    "AFTER",
    "req is_retracted",
    "arrivals (an offline one waits in the pool's backlog) and retracted requests",
)
IS_FULLY_IDLE = Hook(f"{SCHEDULER}.Scheduler.is_fully_idle", "AROUND", "", "not idle while decodes are held")
GET_LOADS = Hook(
    "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer.get_loads",
    "AFTER",
    "",
    "the load report counts a mixed iteration's decodes as running",
)
ABORT_REQUEST = Hook(
    f"{SCHEDULER}.Scheduler.abort_request", "AROUND", "recv_req", "aborts reach the backlog; frees held decodes"
)
GET_INTERNAL_STATE = Hook(
    f"{STATE}.SchedulerInternalStateController.get_internal_state", "AFTER", "", "the plugin's state in /server_info"
)
UPDATE_HANDLERS = Hook(
    f"{STATE}.SchedulerInternalStateController._update_handlers",
    "AFTER",
    "",
    "sgl_blend_* settings through /set_internal_state",
)
# The emulated GPU (`sgl_blend.emulation.sglang_forward`; its clock joins /server_info on GET_INTERNAL_STATE).
EMULATED_FORWARD = Hook(
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "AROUND",
    "batch",
    "the emulated GPU: the model forward, skipped (or run and timed) and priced",
)
EMULATION_NO_BATCH = Hook(
    f"{SCHEDULER}.Scheduler.on_idle",
    "BEFORE",
    "",
    "the emulated GPU idles from a loop that found no batch to the next forward",
)
# SGLang's ``GenerateReqInput.__getitem__`` builds the sub-requests of a batched or ``n > 1`` input
# without its ``routing_key`` (upstream PR #27199): each sample would reach the scheduler as online
# work, without its placement. Applied in the HTTP process, where requests are split.
SUBREQUEST_ROUTING_KEY = Hook(
    f"{IO}.GenerateReqInput.__getitem__",
    "AFTER",
    "i",
    "an n > 1 line's samples keep its offline routing key and placement",
)
# With --skip-server-warmup (a CPU default) SGLang posts /freeze_gc to its own port from its
# warmup thread before uvicorn listens, and logs the refused connection's traceback on every start.
FREEZE_GC_AFTER_WARMUP = Hook(
    "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup",
    "AROUND",
    "server_args",
    "the post-start /freeze_gc waits until the server listens",
)
HOOKS = (
    CALC_PRIORITY,
    PREFILL_ADDER_CLASS,
    NEW_PREFILL_BATCH,
    UPDATE_RUNNING_BATCH,
    RUN_BATCH,
    PROCESS_BATCH_RESULT,
    ADD_REQUEST_TO_QUEUE,
    IS_FULLY_IDLE,
    GET_LOADS,
    ABORT_REQUEST,
    GET_INTERNAL_STATE,
    UPDATE_HANDLERS,
    EMULATED_FORWARD,
    EMULATION_NO_BATCH,
    SUBREQUEST_ROUTING_KEY,
    FREEZE_GC_AFTER_WARMUP,
)

# The batch runner's in-process path (`sgl_blend.server.in_process`): SGLang's OpenAI handler of
# each route, as its lifespan puts them on ``app.state``, and what the runner calls on them.
SERVING_HANDLERS = {
    "/v1/chat/completions": "openai_serving_chat",
    "/v1/completions": "openai_serving_completion",
    "/v1/embeddings": "openai_serving_embedding",
}

# The server's key gate (`sgl_blend.server.key_gate`) stands in for SGLang's api-key middleware,
# which SGLang's start-up installs by importing this function from its module when it runs.
KEY_MIDDLEWARE = Call(
    f"{AUTH}.add_api_key_middleware",
    "app api_key admin_api_key",
    "replaced: the key gate takes every configured key on every route",
)

# Callables whose parameters the plugin names: keywords it passes, arguments it reads, overrides.
ADDER_INIT = Call(
    f"{POLICY}.PrefillAdder.__init__",
    "rem_chunk_tokens num_mixed_decode_tokens",
    "the policy's prefill room is cut from SGLang's chunk minus the mixed decodes",
)
CALLS = (
    ADDER_INIT,
    KEY_MIDDLEWARE,
    Call(f"{AUTH}._get_auth_level_from_app_and_scope", "app scope", "the key gate keeps SGLang's admin routes"),
    Call(
        f"{SERVING}._convert_to_internal_request",
        "request raw_request",
        "a batch line converted as its route converts it, without a request",
    ),
    Call(
        f"{SERVING}._handle_non_streaming_request",
        "adapted_request request raw_request",
        "a batch line run and its response built as its route does",
    ),
    Call(f"{SERVING}._validate_request", "", "a batch line checked as its route checks it"),
    Call(
        f"{SERVING}.create_error_response",
        "message err_type status_code",
        "a batch line's error answered as its route answers it",
    ),
    Call(f"{POLICY}.PrefillAdder.add_one_req", "req has_chunked_req truncation_align_size", "overridden: admission"),
    Call(f"{POLICY}.PrefillAdder.add_chunked_req", "req", "overridden: the co-location chunk cap"),
    Call(f"{CACHE}.radix_cache.RadixCache.__init__", "params", "the backend's cache is built from SGLang's params"),
    Call(f"{CACHE}.radix_cache.RadixCache.on_release", "req checkpointed", "overridden: Echo marks online KV"),
    Call(f"{CACHE}.radix_cache.RadixCache.evict", "params", "overridden: an eviction frees a share of the pool"),
    Call(f"{CACHE}.evict_policy.EvictionStrategy.get_priority", "node", "overridden: Echo's eviction order"),
    Call(f"{CACHE}.common.release_kv_cache", "req tree_cache checkpoint", "parking, aborting held decodes"),
    Call(f"{CACHE}.common.match_kv_cache", "req tree_cache", "Echo's candidates' resident prefix"),
    Call(f"{CACHE}.common.evict_from_tree_cache", "tree_cache num_tokens", "room to restore checkpointed KV"),
    Call(
        f"{BATCH}.ScheduleBatch.init_new",
        "reqs req_to_token_pool token_to_kv_pool_allocator tree_cache model_config enable_overlap spec_algorithm",
        "a decode batch for resumed held requests",
    ),
    Call(f"{BATCH}.ScheduleBatch.filter_batch", "keep_indices", "holding and parking running requests"),
    Call(f"{SCHEDULER}.Scheduler._add_request_to_queue", "req is_retracted", "parked requests go back to the queue"),
    Call(f"{SCHEDULER}.Scheduler.get_num_allocatable_reqs", "running_bs running_batch", "slots online requests need"),
    Call(f"{SCHEDULER}._make_abort_req", "req finished_reason", "the abort output of a freed held request"),
    Call("sglang.srt.managers.overlap_utils.RelayPayload", "bonus_tokens", "a resumed request's last token"),
    Call(
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch",
        "batch vocab_size",
        "sampling state of a resumed request",
    ),
    Call(
        "sglang.srt.managers.utils.GenerationBatchResult",
        "logits_output next_token_ids",
        "the emulated GPU: what a skipped forward returns",
    ),
    Call(
        "sglang.srt.layers.logits_processor.LogitsProcessorOutput",
        "next_token_logits",
        "the emulated GPU: what a skipped forward returns",
    ),
)

# Attributes read or written on SGLang's objects (or their instances), how the plugin's code names them, why.
SURFACES = (
    Surface(
        f"{SCHEDULER}.Scheduler",
        "waiting_queue chunked_req tree_cache token_to_kv_pool_allocator req_to_token_pool model_config "
        "spec_algorithm enable_overlap device future_map forward_ct max_running_requests chunked_prefill_size "
        "page_size result_queue _add_request_to_queue get_num_allocatable_reqs _release_aborted_request "
        "send_abort_output",
        "scheduler",
        "the loop the hooks run in: queues, pools, holding, parking, aborts",
    ),
    Surface(f"{POLICY}.SchedulePolicy", "tree_cache", "policy", "the cache the pool orders against"),
    Surface(
        f"{POLICY}.PrefillAdder",
        "rem_chunk_tokens rem_input_tokens rem_total_tokens cur_rem_tokens chunked_req_limit can_run_list "
        "tree_cache running_batch preempt_list new_chunked_req new_token_ratio per_req_token_overhead "
        "memory_budget req_states add_chunked_req add_one_req budget_state ceil_paged_tokens "
        "_get_running_request_total_token_offset",
        "adder",
        "prefill room, admission, memory shortfall as SGLang measures it",
    ),
    Surface(
        f"{CACHE}.prefill_budget.PrefillBudget",
        "total_offset",
        "adder.memory_budget",
        "a held request stops reserving its future tokens",
    ),
    Surface(
        f"{BATCH}.Req",
        "rid routing_key origin_input_ids output_ids sampling_params kv logprob beam_group "
        "full_untruncated_fill_ids prefix_len extend_end extend_len last_node retraction_count "
        "multimodal_inputs to_finish finished reset_for_retract",
        "req chunked victim other",
        "what the policy and the modes know of a request",
        owned="blend_arrival",
    ),
    Surface(
        f"{BATCH}.ReqKvInfo",
        "kv_committed_len kv_allocated_len cache_protected_len holds_kv req_pool_idx",
        "req.kv victim.kv",
        "the KV a held request keeps, checkpoints and restores",
    ),
    Surface(
        f"{BATCH}.ReqLogprob", "top_logprobs_num token_ids_logprob", "req.logprob", "a resumed batch's logprob settings"
    ),
    Surface(
        "sglang.srt.sampling.sampling_params.SamplingParams",
        "max_new_tokens ignore_eos",
        "req.sampling_params chunked.sampling_params params",
        "output budgets",
    ),
    Surface(
        f"{BATCH}.ScheduleBatch",
        "reqs filter_batch merge_batch is_empty batch_is_full forward_mode seq_lens seq_lens_cpu "
        "orig_seq_lens seq_lens_sum req_pool_indices req_pool_indices_cpu extend_lens prefix_lens "
        "decoding_reqs input_ids multimodal_inputs return_logprob top_logprobs_nums token_ids_logprobs "
        "sampling_info check_decode_mem new_tokens_required_next_decode init_new",
        "batch running_batch resumed adder.running_batch",
        "iteration records; holding, resuming and parking requests",
    ),
    Surface(
        f"{BATCH}.ScheduleBatch",
        "forward_mode reqs device extend_lens prefix_lens seq_lens seq_lens_cpu mix_running_indices_cpu "
        "return_logprob return_hidden_states sampling_info",
        "scheduled",
        "the emulated GPU: a forward's shape, and whether it needs the real model",
    ),
    Surface(
        "sglang.srt.model_executor.forward_batch_info.ForwardMode",
        "is_decode is_mixed name",
        "batch.forward_mode scheduled.forward_mode",
        "the iteration record's mode, the emulated forward's kind",
    ),
    Surface(
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo",
        "penalizer_orchestrator from_schedule_batch grammars",
        "batch.sampling_info scheduled.sampling_info",
        "penalizers of a resumed request; a constrained batch needs the emulated GPU's real model",
    ),
    Surface(
        "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator",
        "is_required cumulate_output_tokens",
        "orchestrator",
        "output tokens replayed to the penalizers",
    ),
    Surface(
        f"{CACHE}.base_prefix_cache.BasePrefixCache",
        "token_to_kv_pool_allocator evictable_size lock unlock disable",
        "tree_cache scheduler.tree_cache adder.tree_cache policy.tree_cache parked.tree_cache",
        "free KV, pinning parked KV",
        owned="annotate_path",
    ),
    Surface(
        f"{CACHE}.radix_cache.RadixCache", "on_release eviction_strategy", "cache", "the sgl-blend backend's subclass"
    ),
    Surface(
        f"{CACHE}.radix_cache.TreeNode",
        "parent key lock_ref last_access_time priority",
        "node ancestor",
        "prefix annotations, Echo's eviction priorities",
        owned="blend_density blend_uses blend_online blend_path_head blend_reusers",
    ),
    Surface(f"{CACHE}.radix_cache.RadixKey", "token_ids __len__", "node.key ancestor.key", "a node's tokens"),
    Surface(
        f"{CACHE}.allocator.base.BaseTokenToKVPoolAllocator",
        "size available_size alloc free get_cpu_copy load_cpu_copy",
        "allocator scheduler.token_to_kv_pool_allocator tree_cache.token_to_kv_pool_allocator",
        "pool size, free slots, KV checkpoints to host",
    ),
    Surface(
        f"{CACHE}.memory_pool.ReqToTokenPool",
        "req_to_token write",
        "scheduler.req_to_token_pool",
        "a request's slots, restored",
    ),
    Surface(
        "sglang.srt.managers.overlap_utils.FutureMap", "stash", "scheduler.future_map", "a resumed request's last token"
    ),
    Surface(
        "sglang.srt.configs.model_config.ModelConfig",
        "is_encoder_decoder vocab_size",
        "scheduler.model_config",
        "which requests can be held",
    ),
    Surface(
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm",
        "is_none",
        "scheduler.spec_algorithm",
        "which requests can be held",
    ),
    Surface(
        "sglang.srt.managers.io_struct.AbortReq", "rid abort_all finished_reason", "recv_req", "aborting held decodes"
    ),
    Surface(
        "sglang.srt.managers.io_struct.GetInternalStateReqOutput",
        "internal_state",
        "result",
        "the plugin's state (and the emulated GPU's clock) in /server_info",
    ),
    Surface(f"{CACHE}.registry.TreeCacheBuildContext", "params", "context", "building the backend's cache"),
    Surface(f"{CACHE}.base_prefix_cache.EvictParams", "num_tokens", "evict_params", "the tokens an eviction frees"),
    Surface(
        "sglang.srt.runtime_context.ParallelContext", "dp_rank", "sgl.get_parallel()", "the DP rank in /server_info"
    ),
    Surface(
        "sglang.srt.server_args.ServerArgs",
        "model_path tp_size dp_size host port disable_overlap_schedule",
        "server_args",
        "the pool's cost model and when a forward's prefix is cached; the batch runner's DP "
        "slots; where the server listens",
    ),
    Surface(
        SERVING,
        "tokenizer_manager _validate_request _convert_to_internal_request _handle_non_streaming_request "
        "create_error_response",
        "handler",
        "the batch runner's in-process path",
    ),
    Surface(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager",
        "tokenizer server_args get_internal_state get_loads gracefully_exit generate_request",
        "tokenizer_manager self.tokenizer_manager self._tokenizer_manager",
        "text prompts tokenised as SGLang does; the engine's size and queue for the runner's window; a SIGTERM's drain",
    ),
    Surface(
        "sglang.srt.managers.load_snapshot.LoadSnapshot",
        "dp_rank num_waiting_reqs num_running_reqs",
        "load",
        "a co-locating engine's queue and running batch, for the runner's window; the running "
        "count corrected in the scheduler",
    ),
    Surface(
        "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer",
        "get_running_batch",
        "inquirer",
        "the running batch the load report counts",
    ),
    Surface(
        f"{IO}.GenerateReqInput",
        "rid routing_key routed_dp_rank received_time text input_ids",
        "adapted conversion.adapted sub batched",
        "a batch line's request: its id, offline key, DP rank and prompt ids; an n > 1 request's samples",
    ),
    # Reached as ``adapted`` too, where the GenerateReqInput row is the one the code is checked against.
    Surface(
        f"{IO}.EmbeddingReqInput", "rid routing_key received_time text input_ids", "", "an embedding line's request"
    ),
)


def __getattr__(name: str) -> Any:
    """SGLang's names, resolved (and imported) on first use."""
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = pkgutil.resolve_name(NAMES[name])
    globals()[name] = value
    return value


def prefill_built(result: tuple[Any, Any]) -> bool:
    """Whether `NEW_PREFILL_BATCH`'s target built a prefill batch (else SGLang decodes next)."""
    return result[0] is not None


def replace_key_middleware(install: Callable[..., None]) -> None:
    """Make SGLang's start-up call ``install`` where it would add its api-key middleware."""
    module, name = KEY_MIDDLEWARE.target.rsplit(".", 1)
    setattr(importlib.import_module(module), name, install)


def register_hook(hook: Hook, function: Callable[..., Any]) -> None:
    __getattr__("HookRegistry").register(hook.target, function, __getattr__("HookType")[hook.kind])


@dataclass(frozen=True)
class Argument:
    """Where one parameter of a hooked or overridden SGLang callable arrives in a call: by position
    (``self`` counted, as a hook receives it) or by name, else its default. Found once from the
    callable's signature (`argument`), then read on every call without inspecting it again."""

    name: str
    position: int
    default: Any

    def read(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if len(args) > self.position:
            return args[self.position]
        return kwargs.get(self.name, self.default)

    def replaced(self, args: tuple, kwargs: dict[str, Any], value: Any) -> tuple[tuple, dict[str, Any]]:
        """The call's arguments with this one set to ``value``."""
        if len(args) > self.position:
            return (*args[: self.position], value, *args[self.position + 1 :]), kwargs
        return args, {**kwargs, self.name: value}


@functools.cache
def argument(call: Hook | Call, name: str) -> Argument:
    """How ``call.target``'s parameter ``name`` is read: the plugin reads (and replaces) SGLang's
    arguments by name, so a parameter SGLang inserts or moves does not shift what it reads."""
    parameters = list(inspect.signature(pkgutil.resolve_name(call.target)).parameters.values())
    position = next(index for index, parameter in enumerate(parameters) if parameter.name == name)
    default = parameters[position].default
    return Argument(name, position, None if default is inspect.Parameter.empty else default)
