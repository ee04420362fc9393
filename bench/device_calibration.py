"""Calibrate the simulator against a real device: roofline rates, co-run overlap, copy bandwidth.

    python -m bench.device_calibration --out bench/results/calibration_cpu.json --quick
    python -m bench.device_calibration --device cuda --out bench/results/calibration_h100.json

One JSON holds the `HardwareSpec` profile (achievable GEMM FLOP/s and decode-attention
bandwidth), the fitted overlap function of GEMM and attention run together (its ``b`` is the
simulator's interference constant), and host <-> device copy rates (BROS's swap model). A PNG
beside it plots measured co-run time against ``max`` and ``sum`` of the two ops alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sgl_blend.kernels.corun import corun_grid, fit_report, green_partitions, measure_corun
from sgl_blend.kernels.profile import run_profile
from sgl_blend.kernels.transfer import measure_transfers, peak_bandwidth

RESULTS = Path(__file__).parent / "results"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["corun"]["samples"]
    longer = [max(s["gemm_s"], s["attention_s"]) * 1e3 for s in samples]
    total = [(s["gemm_s"] + s["attention_s"]) * 1e3 for s in samples]
    fig, axis = plt.subplots(figsize=(5.5, 4.5))
    title = []
    modes = (("naive", "o", lambda s: s["together_s"]), ("partitioned", "x", lambda s: s["partitioned_s"]),
             ("partition_bound", "^", lambda s: max(s["gemm_on_partition_s"], s["attention_on_partition_s"])))
    for mode, marker, seconds in modes:
        if mode in report["corun"]:
            axis.scatter(longer, [seconds(s) * 1e3 for s in samples], s=14, marker=marker, label=mode)
            title.append(f"{mode} lambda {report['corun'][mode]['interference']['lambda']:.2f}")
    axis.plot([0, max(total)], [0, max(total)], color="grey", linewidth=0.8, label="= max(comp, mem)")
    axis.scatter(longer, total, s=6, color="grey", label="comp + mem (no overlap)")
    axis.set_xlabel("max(GEMM alone, attention alone) ms")
    axis.set_ylabel("ms")
    axis.set_title(f"{report['hardware']['name']}\n" + ", ".join(title), fontsize=9)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument("--out", type=Path, default=RESULTS / "calibration.json")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller shapes")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    profile = run_profile(args.out.with_suffix(".hw.json"), str(device), args.quick)
    sizes = {"partitions": green_partitions(device)} if device.type == "cuda" else \
        {"hidden": 1024, "ffn": 2816, "loops": 3}
    samples = [measure_corun(tokens, batch, kv_len, device, dtype, **sizes)
               for tokens, batch, kv_len in corun_grid(device, args.quick)]
    transfers = measure_transfers(device, (1, 16) if args.quick else (1, 16, 64, 256))
    hardware = profile["hardware"]
    report = {
        "hardware": {"name": hardware.name, "flops": hardware.flops, "bandwidth": hardware.bandwidth,
                     "kv_memory_bytes": hardware.kv_memory_bytes, "dtype": str(dtype).removeprefix("torch.")},
        "roofline_table": profile["table"],
        "corun": fit_report(samples),
        "transfer": {"host_to_device_bytes_per_s": peak_bandwidth(transfers, "host_to_device"),
                     "device_to_host_bytes_per_s": peak_bandwidth(transfers, "device_to_host"),
                     "samples": [{"direction": t.direction, "bytes": t.bytes, "seconds": t.seconds} for t in transfers]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(f"{hardware.name}: {hardware.flops / 1e12:.1f} TFLOP/s, {hardware.bandwidth / 1e9:.0f} GB/s")
    for mode in ("naive", "partitioned", "partition_bound"):
        if mode in report["corun"]:
            fit = report["corun"][mode]
            print(f"{mode} co-run: interference lambda {fit['interference']['lambda']:.3f} "
                  f"(error {fit['interference']['mean_abs_error']:.1%}); free fit a={fit['fitted']['a']:.3f} "
                  f"b={fit['fitted']['b']:.3f} k={fit['fitted']['k'] * 1e6:.1f} us "
                  f"(error {fit['fitted']['mean_abs_error']:.1%}); max error {fit['max_mean_abs_error']:.1%}, "
                  f"sum error {fit['sum_mean_abs_error']:.1%}")
    print(f"copy: host->device {report['transfer']['host_to_device_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"device->host {report['transfer']['device_to_host_bytes_per_s'] / 1e9:.1f} GB/s -> {args.out}")


if __name__ == "__main__":
    main()
