"""Co-location flags shared by `sgl-blend serve` and `sgl-blend tune-slo`, and the config they make.

Precedence: an explicit flag, then the `tune-slo` result file (``--slo-file``: budget and latency
model), then the defaults. A budget needs a fitted latency model; the error says where to get one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sgl_blend.core.colocation import MODES, ColocationConfig
from sgl_blend.core.latency_model import FORMS, load_model

if TYPE_CHECKING:
    from sgl_blend.sglang_plugin.settings import PluginSettings


def add_colocation_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("co-location (online and offline work on one server)")
    group.add_argument(
        "--colocation",
        choices=MODES,
        default=None,
        help="off (default), hygen (latency budget, offline decode skipping), echo (SLO "
        "deadlines, KV priorities, online reserve) or bros (Alg. 1 admission by "
        "residual time, adaptive batch size; runs without the radix cache)",
    )
    group.add_argument(
        "--latency-budget-ms",
        type=float,
        default=None,
        help="hygen: per-iteration latency budget once offline work is added",
    )
    group.add_argument(
        "--headroom-ms",
        type=float,
        default=None,
        help="hygen: budget each iteration at the predicted online-only iteration plus this "
        "headroom, capped by --tpot-slo-ms while online requests decode and by the TTFT "
        "slack of a waiting one; --idle-budget-ms (else the headroom) with none present",
    )
    group.add_argument("--latency-model", type=Path, default=None, help="a `sgl-blend profile --latency` JSON")
    group.add_argument(
        "--latency-form",
        choices=FORMS,
        default=None,
        help="which fitted form to use (default: the file's best on held-out batches)",
    )
    group.add_argument(
        "--slo-file", type=Path, default=None, help="a `sgl-blend tune-slo` result: its budget and latency model"
    )
    group.add_argument(
        "--ttft-slo-ms",
        type=float,
        default=None,
        help="echo and bros, and hygen with --headroom-ms: time-to-first-token target",
    )
    group.add_argument(
        "--tpot-slo-ms",
        type=float,
        default=None,
        help="echo and bros, and hygen with --headroom-ms: time-per-output-token target",
    )
    group.add_argument(
        "--idle-budget-ms",
        type=float,
        default=None,
        help="echo, bros and hygen with --headroom-ms: longest iteration while no online "
        "request bounds it (an online request that arrives waits for the iteration under "
        "way); default unbounded",
    )
    group.add_argument(
        "--bros-tail-quantile",
        type=float,
        default=None,
        help="bros: plan each iteration to this quantile of the measured launch-to-launch periods "
        "(e.g. 0.99) instead of their mean, for a host whose periods vary; default off, as in the paper",
    )
    group.add_argument(
        "--psm-utility",
        type=float,
        default=None,
        help="with --offline-policy psm: probability of taking the prefix-sharing order over "
        "the oldest request (HyGen's anti-starvation utility u; default 0.9)",
    )


def _seconds(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000.0


def colocation_config(args: argparse.Namespace) -> ColocationConfig:
    """The config the flags describe; raises ValueError with a message fit for the user."""
    settings: dict[str, Any] = {}
    if args.slo_file is not None:
        try:
            saved = json.loads(Path(args.slo_file).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read --slo-file {args.slo_file}: {error}") from None
        settings.update({key: saved[key] for key in ("mode", "latency_budget_s", "latency_model") if key in saved})
    if args.latency_model is not None:
        try:
            settings["latency_model"] = load_model(args.latency_model, args.latency_form).to_dict()
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot use --latency-model {args.latency_model}: {error}") from None
    for key, value in (
        ("mode", args.colocation),
        ("latency_budget_s", _seconds(args.latency_budget_ms)),
        ("headroom_s", _seconds(args.headroom_ms)),
        ("ttft_slo_s", _seconds(args.ttft_slo_ms)),
        ("tpot_slo_s", _seconds(args.tpot_slo_ms)),
        ("idle_budget_s", _seconds(args.idle_budget_ms)),
        ("bros_tail_quantile", args.bros_tail_quantile),
    ):
        if value is not None:
            settings[key] = value
    budgeted = settings.get("latency_budget_s") is not None or settings.get("headroom_s") is not None
    if budgeted and "mode" not in settings:
        settings["mode"] = "hygen"
    try:
        return ColocationConfig.from_dict(settings)
    except ValueError as error:
        hint = " (fit one with `sgl-blend profile --latency`)" if "latency model" in str(error) else ""
        raise ValueError(f"{error}{hint}") from None


def colocation_server_settings(args: argparse.Namespace, settings: PluginSettings) -> PluginSettings:
    """``settings`` with what the co-location flags in ``args`` ask for (the SGLang flags that
    follow from them are `PluginSettings.sglang_flags`)."""
    config = colocation_config(args)
    if args.psm_utility is not None and not 0.0 <= args.psm_utility <= 1.0:
        raise ValueError(f"--psm-utility must be in [0, 1], got {args.psm_utility}")
    return settings.updated(colocation=config, psm_utility=args.psm_utility)
