"""Batch-latency predictors: what one scheduler iteration of a given composition will cost.

Three model forms, fitted on the same per-iteration records so they can be compared:

- ``hygen`` (HyGen §4.2): a linear regression on ``(S_p, S_d, S_p², S_d², N_p, N_d)`` plus an
  intercept -- prefill tokens, decode context tokens, their squares, and request counts.
- ``echo`` (Echo §5.2): ``prefill = max(α l² + β l, c)`` with ``l = S_p``, ``decode = γ max(L) +
  δ mean(L)`` over decode contexts ``L``, and a mixed batch ``λ max(P, D) + (1-λ) min(P, D)``.
- ``bros`` (BROS §4): per phase ``a0 L_n + a1 L_n L_a + b`` (new tokens, new tokens times attended
  context), prefill and decode summed. For decode, ``L_n L_a`` summed over requests is ``S_d``.

A scheduler only needs `LatencyModel.predict`; `max_prefill` is HyGen's ``get_max_prefill``.
Everything here is plain numpy so the SGLang plugin and the simulator call the same code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

FORMS = ("hygen", "echo", "bros")


@dataclass(frozen=True, slots=True)
class BatchShape:
    """The composition of one forward batch, as every model form reads it.

    ``prefill_attention`` is ``Σ extend · (prefix + extend)`` over prefill requests: the attention
    work of a prefill chunk that sits on a cached prefix, which only the BROS form uses.
    ``prefill_chunks`` keeps each prefill request's ``(extend, prefix)``: Echo's estimator costs
    prefills one request at a time (its floor ``c`` applies per request, not per batch).
    """

    prefill_tokens: int = 0
    prefill_reqs: int = 0
    prefill_attention: int = 0
    decode_reqs: int = 0
    decode_context: int = 0
    decode_max_context: int = 0
    prefill_chunks: tuple[tuple[int, int], ...] = ()

    def with_prefill(self, extend: int, prefix: int = 0) -> BatchShape:
        if extend <= 0:
            return self
        return BatchShape(self.prefill_tokens + extend, self.prefill_reqs + 1,
                          self.prefill_attention + extend * (prefix + extend), self.decode_reqs,
                          self.decode_context, self.decode_max_context, (*self.prefill_chunks, (extend, prefix)))

    def with_decode(self, context: int) -> BatchShape:
        # Direct construction: a scheduler grows one shape per request every iteration, and
        # `dataclasses.replace` costs several times as much.
        return BatchShape(self.prefill_tokens, self.prefill_reqs, self.prefill_attention, self.decode_reqs + 1,
                          self.decode_context + context, max(self.decode_max_context, context), self.prefill_chunks)

    def is_empty(self) -> bool:
        return self.prefill_reqs == 0 and self.decode_reqs == 0

    def to_dict(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in COUNT_FIELDS},
                "prefill_chunks": [list(chunk) for chunk in self.prefill_chunks]}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> BatchShape:
        """A record without per-request chunks (an older profile) is read as one chunk per
        request of the average length, which keeps the aggregate fields exact."""
        counts = {name: int(record.get(name, 0)) for name in COUNT_FIELDS}
        chunks = record.get("prefill_chunks")
        if chunks is None and counts["prefill_reqs"]:
            share = counts["prefill_tokens"] // counts["prefill_reqs"]
            chunks = [[share, 0]] * counts["prefill_reqs"]
        return cls(**counts, prefill_chunks=tuple((int(extend), int(prefix)) for extend, prefix in chunks or ()))


COUNT_FIELDS = ("prefill_tokens", "prefill_reqs", "prefill_attention", "decode_reqs", "decode_context",
                "decode_max_context")


class LatencyModel(Protocol):
    form: str

    def predict(self, shape: BatchShape) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...


def _hygen_features(shape: BatchShape) -> list[float]:
    s_p, s_d = float(shape.prefill_tokens), float(shape.decode_context)
    return [1.0, s_p, s_d, s_p * s_p, s_d * s_d, float(shape.prefill_reqs), float(shape.decode_reqs)]


def _bros_features(shape: BatchShape) -> list[float]:
    return [float(shape.prefill_reqs > 0), float(shape.prefill_tokens), float(shape.prefill_attention),
            float(shape.decode_reqs > 0), float(shape.decode_reqs), float(shape.decode_context)]


LINEAR_FEATURES: dict[str, tuple[tuple[str, ...], Callable[[BatchShape], list[float]]]] = {
    "hygen": (("intercept", "S_p", "S_d", "S_p^2", "S_d^2", "N_p", "N_d"), _hygen_features),
    "bros": (("b_prefill", "a0_prefill", "a1_prefill", "b_decode", "a0_decode", "a1_decode"), _bros_features),
}


@dataclass(frozen=True)
class LinearLatencyModel:
    """HyGen's and BROS's forms: time is a dot product of coefficients and features."""

    form: str
    coefficients: tuple[float, ...]

    def predict(self, shape: BatchShape) -> float:
        if shape.is_empty():
            return 0.0
        return float(np.dot(self.coefficients, LINEAR_FEATURES[self.form][1](shape)))

    def to_dict(self) -> dict[str, Any]:
        names = LINEAR_FEATURES[self.form][0]
        return {"form": self.form, "coefficients": dict(zip(names, self.coefficients))}


@dataclass(frozen=True)
class EchoLatencyModel:
    """Echo's form; ``floor`` is the constant ``c``, ``mix`` is ``λ``."""

    alpha: float
    beta: float
    floor: float
    gamma: float
    delta: float
    mix: float
    form: str = "echo"

    def prefill_time(self, tokens: int) -> float:
        return max(self.alpha * tokens * tokens + self.beta * tokens, self.floor) if tokens > 0 else 0.0

    def decode_time(self, shape: BatchShape) -> float:
        if shape.decode_reqs == 0:
            return 0.0
        return self.gamma * shape.decode_max_context + self.delta * shape.decode_context / shape.decode_reqs

    def predict(self, shape: BatchShape) -> float:
        prefill, decode = self.prefill_time(shape.prefill_tokens), self.decode_time(shape)
        if not prefill or not decode:
            return prefill + decode
        return self.mix * max(prefill, decode) + (1.0 - self.mix) * min(prefill, decode)

    def to_dict(self) -> dict[str, Any]:
        return {"form": "echo", "coefficients": {"alpha": self.alpha, "beta": self.beta, "c": self.floor,
                                                  "gamma": self.gamma, "delta": self.delta, "lambda": self.mix}}


def model_from_dict(data: dict[str, Any]) -> LatencyModel:
    """The inverse of ``to_dict``; raises ValueError on an unknown form or missing coefficient."""
    form = data.get("form")
    coefficients = data.get("coefficients") or {}
    try:
        if form == "echo":
            return EchoLatencyModel(alpha=float(coefficients["alpha"]), beta=float(coefficients["beta"]),
                                    floor=float(coefficients["c"]), gamma=float(coefficients["gamma"]),
                                    delta=float(coefficients["delta"]), mix=float(coefficients["lambda"]))
        if form in LINEAR_FEATURES:
            return LinearLatencyModel(form, tuple(float(coefficients[name]) for name in LINEAR_FEATURES[form][0]))
    except KeyError as missing:
        raise ValueError(f"latency model {form!r} lacks coefficient {missing}") from None
    raise ValueError(f"unknown latency model form {form!r}; known: {', '.join(FORMS)}")


def _least_squares(rows: list[list[float]], times: Sequence[float]) -> np.ndarray:
    """Least squares on relative error (each row divided by its time), since batches span
    milliseconds to seconds and the score is a percentage error; columns are scaled because
    S_p² and a constant column differ by ~10⁷."""
    target = np.asarray(times, dtype=float)
    weight = 1.0 / np.maximum(target, 1e-9)
    matrix = np.asarray(rows, dtype=float) * weight[:, None]
    scale = np.abs(matrix).max(axis=0)
    scale[scale == 0] = 1.0
    solution, *_ = np.linalg.lstsq(matrix / scale, target * weight, rcond=None)
    return solution / scale


def fit_linear(form: str, shapes: Sequence[BatchShape], times: Sequence[float]) -> LinearLatencyModel:
    features = LINEAR_FEATURES[form][1]
    return LinearLatencyModel(form, tuple(float(x) for x in _least_squares([features(s) for s in shapes], times)))


def fit_echo(shapes: Sequence[BatchShape], times: Sequence[float]) -> EchoLatencyModel:
    """Fit each of Echo's parts on the batches that isolate it: prefill-only batches give α, β
    and c, decode-only batches γ and δ, mixed batches λ (closed form, clipped to [0, 1])."""
    prefill = [(s, t) for s, t in zip(shapes, times) if s.prefill_reqs and not s.decode_reqs]
    decode = [(s, t) for s, t in zip(shapes, times) if s.decode_reqs and not s.prefill_reqs]
    mixed = [(s, t) for s, t in zip(shapes, times) if s.decode_reqs and s.prefill_reqs]
    if len(prefill) < 3 or len(decode) < 2:
        raise ValueError("Echo's form needs at least 3 prefill-only and 2 decode-only batches")
    alpha, beta, floor = _fit_prefill_floor(prefill)
    gamma, delta = _least_squares([[s.decode_max_context, s.decode_context / s.decode_reqs] for s, _ in decode],
                                  [t for _, t in decode])
    model = EchoLatencyModel(alpha, beta, floor, float(gamma), float(delta), 1.0)
    if not mixed:
        return model
    high, low, observed = [], [], []
    for shape, time in mixed:
        parts = (model.prefill_time(shape.prefill_tokens), model.decode_time(shape))
        high.append(max(parts))
        low.append(min(parts))
        observed.append(time)
    spread = np.asarray(high) - np.asarray(low)
    denominator = float(np.dot(spread, spread))
    mix = float(np.dot(np.asarray(observed) - np.asarray(low), spread) / denominator) if denominator else 1.0
    return replace(model, mix=min(max(mix, 0.0), 1.0))


def _fit_prefill_floor(samples: list[tuple[BatchShape, float]]) -> tuple[float, float, float]:
    """α, β and the floor c of ``max(α l² + β l, c)``: for each candidate floor (a quantile of the
    observed times) fit the parabola on the batches above it and keep the least total error."""
    tokens = np.asarray([s.prefill_tokens for s, _ in samples], dtype=float)
    times = np.asarray([t for _, t in samples], dtype=float)
    best: tuple[float, float, float, float] | None = None
    for floor in np.unique(np.quantile(times, np.linspace(0.0, 0.5, 11))):
        rising = times > floor
        if rising.sum() < 2:
            continue
        alpha, beta = _least_squares([[l * l, l] for l in tokens[rising]], times[rising])
        error = float(np.sum((np.maximum(alpha * tokens ** 2 + beta * tokens, floor) - times) ** 2))
        if best is None or error < best[0]:
            best = (error, float(alpha), float(beta), float(floor))
    if best is None:
        raise ValueError("prefill-only batches are all the same duration; cannot fit Echo's prefill curve")
    return best[1], best[2], best[3]


def fit(form: str, shapes: Sequence[BatchShape], times: Sequence[float]) -> LatencyModel:
    if form == "echo":
        return fit_echo(shapes, times)
    if form in LINEAR_FEATURES:
        return fit_linear(form, shapes, times)
    raise ValueError(f"unknown latency model form {form!r}; known: {', '.join(FORMS)}")


def mape(model: LatencyModel, shapes: Sequence[BatchShape], times: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction (0.05 is 5%)."""
    errors = [abs(model.predict(s) - t) / t for s, t in zip(shapes, times) if t > 0]
    return float(np.mean(errors)) if errors else float("nan")


@dataclass
class FitReport:
    """Every form fitted on the same training batches and scored on the same held-out ones."""

    models: dict[str, LatencyModel]
    train_mape: dict[str, float]
    holdout_mape: dict[str, float]
    train_batches: int
    holdout_batches: int
    errors: dict[str, str] = field(default_factory=dict)

    def best_form(self) -> str:
        return min(self.holdout_mape, key=lambda form: self.holdout_mape[form])

    def to_dict(self) -> dict[str, Any]:
        return {
            "train_batches": self.train_batches,
            "holdout_batches": self.holdout_batches,
            "best": self.best_form() if self.holdout_mape else None,
            "forms": {form: {**model.to_dict(), "train_mape": self.train_mape[form],
                             "holdout_mape": self.holdout_mape[form]} for form, model in self.models.items()},
            "errors": self.errors,
        }


def fit_forms(shapes: Sequence[BatchShape], times: Sequence[float], holdout_fraction: float = 0.25,
              seed: int = 0, forms: Sequence[str] = FORMS) -> FitReport:
    """Fit each form on a seeded random split; a form that cannot be fitted is reported, not fatal."""
    if len(shapes) != len(times) or len(shapes) < 8:
        raise ValueError(f"need at least 8 timed batches with shapes, got {len(shapes)} shapes, {len(times)} times")
    order = np.random.default_rng(seed).permutation(len(shapes))
    cut = max(1, int(round(len(shapes) * holdout_fraction)))
    held, train = order[:cut], order[cut:]
    train_shapes, train_times = [shapes[i] for i in train], [times[i] for i in train]
    held_shapes, held_times = [shapes[i] for i in held], [times[i] for i in held]
    report = FitReport({}, {}, {}, len(train), len(held))
    for form in forms:
        try:
            model = fit(form, train_shapes, train_times)
        except ValueError as error:
            report.errors[form] = str(error)
            continue
        report.models[form] = model
        report.train_mape[form] = mape(model, train_shapes, train_times)
        report.holdout_mape[form] = mape(model, held_shapes, held_times)
    return report


def load_model(path: Path, form: str | None = None) -> LatencyModel:
    """A model from a `sgl-blend profile --latency` file: the named form, or its best one."""
    data = json.loads(Path(path).read_text())
    forms = data.get("forms")
    if forms is None:
        return model_from_dict(data)
    chosen = form or data.get("best")
    if chosen not in forms:
        raise ValueError(f"{path} has no fitted {chosen!r} model; it has {', '.join(forms) or 'none'}")
    return model_from_dict(forms[chosen])


def max_prefill(model: LatencyModel, budget_s: float, batch: BatchShape, extend: int, prefix: int,
                chunk_tokens: int, memory_tokens: int) -> tuple[int, float]:
    """HyGen's ``get_max_prefill(t, c, m, r)``: the longest chunk of ``extend`` remaining prompt
    tokens that keeps ``batch`` plus the chunk within ``budget_s``, ``chunk_tokens`` and
    ``memory_tokens``, and the predicted batch time with it. (0, time) when nothing fits.

    Bisection instead of solving the quadratic works for every form; it assumes the prediction
    grows with the chunk, and only ever returns a chunk whose prediction was checked.
    """
    high = min(extend, chunk_tokens, memory_tokens)
    base = model.predict(batch)
    if high <= 0:
        return 0, base

    def fits(length: int) -> bool:
        return model.predict(batch.with_prefill(length, prefix)) <= budget_s

    if fits(high):
        return high, model.predict(batch.with_prefill(high, prefix))
    low = 0
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, model.predict(batch.with_prefill(low, prefix)) if low else base
