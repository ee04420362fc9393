"""How far the emulated clock is from real forwards: a real server with ``--emulate cpu``.

    python -m bench.emulator_check [--models tiny-llama,smollm2-135m]

Each model is served for real on this CPU with ``--emulate cpu`` (and ``--enable-mixed-chunk``): the
real forward runs, and the emulator prices the same forward with the built-in ``cpu`` profile
(`HardwareSpec` "cpu": 0.1 TFLOP/s, 9 GB/s, overlap 1.36) at the model's own shapes. The workload
drives three batch kinds through SGLang's scheduler: prefill-only forwards (one request at a time,
``max_new_tokens`` 1, prompts of 16 to 2048 tokens, cold and on a cached prefix), decode batches (1,
4 and 16 requests decoding together) and mixed batches (prompts of 128 to 1024 tokens arriving one
at a time while 8 requests decode).
Every forward's measured and emulated seconds are written to ``bench/results/emulator_check.json``
with, per batch kind, the summed ratio measured / emulated and the per-forward relative error; the
PNG plots emulated against measured per forward.

The cost model prices FLOPs and bytes only; a forward on this CPU also pays SGLang's and PyTorch's
host work per forward (batch preparation, kernel dispatch, sampling), which the model omits. The
numbers are reported as measured: the cost model is not tuned to them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
from pathlib import Path
from typing import Any

import requests

from sgl_blend.core.cost_model import HardwareSpec
from sgl_blend.emulation.clock_reader import read_clock
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.emulation.pricing import KINDS
from sgl_blend.launch.colocation import with_free_port
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import PluginSettings

RESULTS = Path(__file__).parent / "results"
PREFILL_LENGTHS = (16, 64, 256, 1024, 2048)
PREFILL_REPEATS = 3
CACHED_PREFIX = 1024
DECODE_BATCHES = (1, 4, 16)
DECODE_TOKENS = 32
MIXED_DECODERS = 8
# Decoders run until the arrivals are done; this only bounds them.
MIXED_DECODE_LIMIT = 4096
MIXED_PROMPTS = (128, 512, 1024)
MIXED_REPEATS = 3
FIRST_TOKEN = 100


def prompt(length: int, offset: int = 0) -> list[int]:
    return [FIRST_TOKEN + (offset + index) % 800 for index in range(length)]


def generate(server: ServerProcess, input_ids: list[int], max_new_tokens: int) -> None:
    requests.post(f"{server.base_url}/generate", timeout=600, json={
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0},
    }).raise_for_status()


def decode_until(server: ServerProcess, input_ids: list[int], started: threading.Event, stop: threading.Event) -> None:
    """Decode, streaming, until ``stop``: ``started`` is set once the first token is back (its
    prefill is done); leaving the stream makes SGLang abort the request."""
    with requests.post(f"{server.base_url}/generate", stream=True, timeout=600, json={
        "input_ids": input_ids, "stream": True,
        "sampling_params": {"max_new_tokens": MIXED_DECODE_LIMIT, "ignore_eos": True, "temperature": 0},
    }) as response:
        response.raise_for_status()
        for _line in response.iter_lines():
            started.set()
            if stop.is_set():
                return


def together(calls: list[tuple[list[int], int]], server: ServerProcess) -> None:
    threads = [threading.Thread(target=generate, args=(server, ids, tokens)) for ids, tokens in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def drive(server: ServerProcess) -> list[dict[str, Any]]:
    """The workload, phase by phase; the forwards each phase added (each phase stays within the
    clock's list of recent forwards)."""
    records: list[dict[str, Any]] = []

    def phase(run) -> None:
        before = read_clock(server.base_url).ranks[0]["forwards"]
        run()
        state = read_clock(server.base_url).ranks[0]
        added = state["forwards"] - before
        assert added <= len(state["recent"]), "a phase outgrew the clock's recent forwards"
        records.extend(state["recent"][len(state["recent"]) - added:])

    def prefills() -> None:
        for repeat in range(PREFILL_REPEATS):
            for length in PREFILL_LENGTHS:
                generate(server, prompt(length, offset=997 * repeat + length), 1)
            generate(server, prompt(CACHED_PREFIX) + prompt(64, offset=300 + repeat), 1)

    def decodes() -> None:
        for size in DECODE_BATCHES:
            together([(prompt(32, offset=17 * index + size), DECODE_TOKENS) for index in range(size)], server)

    def mixed() -> None:
        decoding, stop = [threading.Event() for _ in range(MIXED_DECODERS)], threading.Event()
        decoders = [threading.Thread(target=decode_until, args=(server, prompt(32, offset=31 * index), started, stop))
                    for index, started in enumerate(decoding)]
        for thread in decoders:
            thread.start()
        for started in decoding:
            started.wait()
        for repeat in range(MIXED_REPEATS):
            for length in MIXED_PROMPTS:
                generate(server, prompt(length, offset=503 + 211 * repeat + length), 1)
        stop.set()
        for thread in decoders:
            thread.join()

    for run in (prefills, decodes, mixed):
        phase(run)
    return records


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_kind = {}
    for kind in KINDS:
        mine = [record for record in records if record["kind"] == kind]
        if not mine:
            continue
        measured = sum(record["measured_seconds"] for record in mine)
        emulated = sum(record["seconds"] for record in mine)
        errors = [(record["seconds"] - record["measured_seconds"]) / record["measured_seconds"] for record in mine]
        by_kind[kind] = {
            "forwards": len(mine),
            "measured_seconds": measured,
            "emulated_seconds": emulated,
            "measured_over_emulated": measured / emulated,
            "median_relative_error": statistics.median(errors),
            "median_abs_relative_error": statistics.median(abs(error) for error in errors),
            "median_measured_ms": statistics.median(record["measured_seconds"] for record in mine) * 1e3,
            "median_emulated_ms": statistics.median(record["seconds"] for record in mine) * 1e3,
        }
    return by_kind


def run_model(model: str, log_dir: Path) -> dict[str, Any]:
    plan = emulated_launch("cpu", model, with_free_port(["--enable-mixed-chunk"]))
    server = start_server(str(plan.model_path), plan.sglang_args, settings=plan.settings_for(PluginSettings()),
                          log_path=log_dir / f"emulator_check-{model}.log")
    try:
        records = drive(server)
        state = read_clock(server.base_url).ranks[0]
    finally:
        server.stop()
    return {"model": model, "model_shape": state["model_shape"], "by_kind": summarise(records),
            "forwards": [{"kind": record["kind"], "shape": record["shape"], "emulated_seconds": record["seconds"],
                          "measured_seconds": record["measured_seconds"]} for record in records]}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["models"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.6), squeeze=False)
    for axis, run in zip(axes[0], runs):
        for kind, marker in zip(KINDS, "o^s"):
            points = [(f["measured_seconds"] * 1e3, f["emulated_seconds"] * 1e3) for f in run["forwards"]
                      if f["kind"] == kind]
            if points:
                ratio = run["by_kind"][kind]["measured_over_emulated"]
                axis.scatter(*zip(*points), s=12, marker=marker, label=f"{kind} (measured/emulated {ratio:.2f})")
        low = min(min(f["measured_seconds"], f["emulated_seconds"]) for f in run["forwards"]) * 1e3
        high = max(max(f["measured_seconds"], f["emulated_seconds"]) for f in run["forwards"]) * 1e3
        axis.plot([low, high], [low, high], color="grey", linewidth=0.8, label="emulated = measured")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("measured forward (ms)")
        axis.set_ylabel("emulated forward (ms)")
        axis.set_title(f"{run['model']} on the `cpu` profile", fontsize=9)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-llama,smollm2-135m", help="comma-separated models to serve")
    parser.add_argument("--out", type=Path, default=RESULTS / "emulator_check.json")
    args = parser.parse_args()
    cpu = HardwareSpec.resolve("cpu")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "hardware": {"name": cpu.name, "flops": cpu.flops, "bandwidth": cpu.bandwidth,
                     "corun_interference": cpu.corun_interference},
        "models": [run_model(model, Path(tempfile.mkdtemp(prefix="emulator-check-")))
                   for model in args.models.split(",")],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out.with_suffix(".png"))
    for run in report["models"]:
        for kind, row in run["by_kind"].items():
            print(f"{run['model']:>14} {kind:>8}: {row['forwards']:4d} forwards, measured {row['measured_seconds']:.3f} s, "
                  f"emulated {row['emulated_seconds']:.3f} s, measured/emulated {row['measured_over_emulated']:.2f}, "
                  f"median error {row['median_relative_error']:+.1%}")


if __name__ == "__main__":
    main()
