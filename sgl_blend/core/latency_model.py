"""Batch-latency predictors: what one scheduler iteration of a given composition will cost.

Three model forms, fitted on the same per-iteration records so they can be compared:

- ``hygen`` (HyGen §4.2): a linear regression on ``(S_p, S_d, S_p², S_d², N_p, N_d)`` plus an
  intercept -- prefill tokens, decode context tokens, their squares, and request counts.
- ``echo`` (Echo §5.2): each prefill request costs ``max(α l² + β l, c)``, summed over the
  batch's prefill requests; decode ``γ max(L) + δ mean(L)`` over decode contexts ``L``; a mixed
  batch ``λ max(P, D) + (1-λ) min(P, D)``. `EchoLatencyModel` says which terms a CPU adds and why.
- ``bros`` (BROS §4): per phase ``a0 L_n + a1 L_n L_a + b`` (new tokens, new tokens times attended
  context), prefill and decode summed. For decode, ``L_n L_a`` summed over requests is ``S_d``.

A scheduler only needs `LatencyModel.predict`; `max_prefill` is HyGen's ``get_max_prefill``.
Everything here is plain numpy so the SGLang plugin and the simulator call the same code.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

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

    @property
    def requests(self) -> int:
        """Prefill and decode requests together: what the host's per-request time scales with."""
        return self.prefill_reqs + self.decode_reqs

    def with_prefill(self, extend: int, prefix: int = 0) -> BatchShape:
        if extend <= 0:
            return self
        return BatchShape(
            self.prefill_tokens + extend,
            self.prefill_reqs + 1,
            self.prefill_attention + extend * (prefix + extend),
            self.decode_reqs,
            self.decode_context,
            self.decode_max_context,
            (*self.prefill_chunks, (extend, prefix)),
        )

    def with_decode(self, context: int) -> BatchShape:
        # Direct construction: a scheduler grows one shape per request every iteration, and
        # `dataclasses.replace` costs several times as much.
        return BatchShape(
            self.prefill_tokens,
            self.prefill_reqs,
            self.prefill_attention,
            self.decode_reqs + 1,
            self.decode_context + context,
            max(self.decode_max_context, context),
            self.prefill_chunks,
        )

    @classmethod
    def of(cls, extends: Sequence[tuple[int, int]] = (), decode_contexts: Sequence[int] = ()) -> BatchShape:
        """A forward that extends each request of ``extends`` by ``(extend, prefix)`` tokens and
        decodes one token for each context length of ``decode_contexts``, built at once: a
        scheduler builds one every iteration over thousands of requests."""
        chunks = tuple((extend, prefix) for extend, prefix in extends if extend > 0)
        return cls(
            sum(extend for extend, _prefix in chunks),
            len(chunks),
            sum(extend * (prefix + extend) for extend, prefix in chunks),
            len(decode_contexts),
            sum(decode_contexts),
            max(decode_contexts, default=0),
            chunks,
        )

    def is_empty(self) -> bool:
        return self.prefill_reqs == 0 and self.decode_reqs == 0

    @property
    def causal_pairs(self) -> float:
        """Query-key pairs causal attention computes for the prefill chunks: each new token
        attends its request's cached prefix and the new tokens up to itself. (The latency forms'
        ``prefill_attention`` counts the full square instead, as SGLang's CPU attention computes it.)"""
        return sum(extend * prefix + extend * (extend + 1) / 2 for extend, prefix in self.prefill_chunks)

    def to_dict(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in COUNT_FIELDS},
            "prefill_chunks": [list(chunk) for chunk in self.prefill_chunks],
        }

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


COUNT_FIELDS = (
    "prefill_tokens",
    "prefill_reqs",
    "prefill_attention",
    "decode_reqs",
    "decode_context",
    "decode_max_context",
)


class Predictor(Protocol):
    """What prices a batch: a fitted `LatencyModel`, or one scaled to the engine as it is now."""

    def predict(self, shape: BatchShape) -> float: ...


class LatencyModel(Predictor, Protocol):
    @property
    def form(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


def _hygen_features(shape: BatchShape) -> list[float]:
    s_p, s_d = float(shape.prefill_tokens), float(shape.decode_context)
    return [1.0, s_p, s_d, s_p * s_p, s_d * s_d, float(shape.prefill_reqs), float(shape.decode_reqs)]


def _bros_features(shape: BatchShape) -> list[float]:
    return [
        float(shape.prefill_reqs > 0),
        float(shape.prefill_tokens),
        float(shape.prefill_attention),
        float(shape.decode_reqs > 0),
        float(shape.decode_reqs),
        float(shape.decode_context),
    ]


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
    """Echo's estimator (§5.2), costed per request, with the terms SGLang on a CPU needs.

    The paper's form: each prefill request costs ``max(α l² + β l, c)`` ("it is common practice to
    process prefill requests one by one"), summed over the batch's prefill requests; a decode
    batch ``γ max(L) + δ mean(L)``; a mixed batch ``λ max(P, D) + (1-λ) min(P, D)``. Here ``l`` is
    the request's new tokens and ``l²`` its attention work, with a coefficient for each way a
    kernel does that work: ``alpha`` per ``(prefix + extend)²`` and ``alpha_chunk`` per ``extend ·
    (prefix + extend)``; both are ``l²`` without a cached prefix.

    The extensions, each measured with `sgl-blend profile --latency` on tiny-llama, SGLang 0.5.23's
    ``torch_native`` attention backend, 2 CPU cores (`bench/results/latency-model.json`; the
    figures below come from the per-iteration records written beside it, which git ignores, in a
    run whose noise floor was 8.2%):

    - ``alpha`` on the whole square: that backend runs attention request by request and computes
      the full causal square of a request with a cached prefix (it pads the query to
      ``prefix + extend`` rows). A 32-token chunk took 13.6-14.4 ms on a 1024-token prefix and
      5.0 ms on a 256-token one; the fitted ``alpha`` (7.3e-9 s) puts 7.5 ms on that difference,
      while a coefficient on ``extend · (prefix + extend)`` large enough to explain it would cost
      a plain 1024-token prefill 0.38 s (measured: 26-48 ms). Given both terms, the fit puts
      everything on ``alpha`` and zero on ``alpha_chunk``.
    - ``prefill_base``, once per prefill batch: three 16-token prefills in one batch took 5.2 ms,
      one alone 2.8-4.3 ms, so the fixed cost belongs to the forward, not to each request; the
      fitted per-request floor ``c`` comes out at zero and ``prefill_base`` at 3.7 ms.
    - ``decode_base + decode_per_request · N + decode_per_token · ΣL`` on the decode side: the
      backend loops over the decoding requests one at a time, so a decode batch costs per request
      and per context token rather than as a pooling over lengths. The paper's two terms alone
      scored 63% held-out MAPE on the decode-only batches (1-32 requests, 64-2048 tokens each),
      the extended part 14%, at 1.7 ms per forward, 0.16 ms per request, 0.39 µs per context
      token.
    - ``decode_as_prefill``: in a mixed batch that share of each decode counts in ``P`` as a
      one-token prefill over its context (without the floor; the fit picks the share on the mixed
      batches, in tenths). SGLang runs a mixed batch as one extend, so on that backend each
      decode pays the square of its context: sixteen decodes of ~513 tokens next to a 31-token
      prefill took 68 ms, the same decodes alone 9.6 ms. The fit picks 1.0; held-out MAPE on mixed
      batches is 13% with it, 25% with ``P`` over the prefill requests alone.

    Every coefficient is non-negative, so a prediction grows with the batch (`max_prefill`
    bisects on that), and the paper's form is the one with the extensions at zero.
    """

    alpha: float
    beta: float
    floor: float
    gamma: float
    delta: float
    mix: float
    alpha_chunk: float = 0.0
    prefill_base: float = 0.0
    decode_base: float = 0.0
    decode_per_request: float = 0.0
    decode_per_token: float = 0.0
    decode_as_prefill: float = 0.0
    form: str = field(default="echo", init=False)

    def request_work(self, extend: float, span: float) -> float:
        """``α l² + β l`` of one request of ``extend`` new tokens in a ``span``-token sequence."""
        return (self.alpha * span + self.alpha_chunk * extend) * span + self.beta * extend

    def prefill_time(self, shape: BatchShape) -> float:
        """The prefill requests' part ``P``, each request floored at ``c``. A shape built from
        sums (no ``prefill_chunks``) is read as equal requests with its totals."""
        if not shape.prefill_reqs:
            return 0.0
        if shape.prefill_chunks:
            total = sum(
                max(self.request_work(extend, extend + prefix), self.floor) for extend, prefix in shape.prefill_chunks
            )
        else:
            extend, span = _equal_share(shape)
            total = shape.prefill_reqs * max(self.request_work(extend, span), self.floor)
        return self.prefill_base + total

    def decode_time(self, shape: BatchShape) -> float:
        if not shape.decode_reqs:
            return 0.0
        mean = shape.decode_context / shape.decode_reqs
        return (
            self.decode_base
            + self.decode_per_request * shape.decode_reqs
            + self.decode_per_token * shape.decode_context
            + self.gamma * shape.decode_max_context
            + self.delta * mean
        )

    def mixed_prefill_time(self, shape: BatchShape) -> float:
        """``P`` of a mixed batch: its prefills plus ``decode_as_prefill`` of each decode costed as
        a one-token prefill over its context (contexts taken as equal: the shape keeps their sum)."""
        if not self.decode_as_prefill:
            return self.prefill_time(shape)
        one_token = self.request_work(1.0, shape.decode_context / shape.decode_reqs)
        return self.prefill_time(shape) + self.decode_as_prefill * shape.decode_reqs * one_token

    def predict(self, shape: BatchShape) -> float:
        if not shape.decode_reqs:
            return self.prefill_time(shape)
        decode = self.decode_time(shape)
        if not shape.prefill_reqs:
            return decode
        prefill = self.mixed_prefill_time(shape)
        return self.mix * max(prefill, decode) + (1.0 - self.mix) * min(prefill, decode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "form": "echo",
            "coefficients": {name: getattr(self, attribute) for name, attribute in ECHO_COEFFICIENTS.items()},
        }


ECHO_COEFFICIENTS = {
    "alpha": "alpha",
    "beta": "beta",
    "c": "floor",
    "gamma": "gamma",
    "delta": "delta",
    "lambda": "mix",
    "alpha_chunk": "alpha_chunk",
    "prefill_base": "prefill_base",
    "decode_base": "decode_base",
    "decode_per_request": "decode_per_request",
    "decode_per_token": "decode_per_token",
    "decode_as_prefill": "decode_as_prefill",
}
ECHO_PAPER_COEFFICIENTS = ("alpha", "beta", "c", "gamma", "delta", "lambda")


def _equal_share(shape: BatchShape) -> tuple[float, float]:
    """``(extend, span)`` of one of ``prefill_reqs`` equal requests with the shape's totals:
    ``prefill_attention = Σ extend · span`` gives the span."""
    extend = shape.prefill_tokens / shape.prefill_reqs
    span = shape.prefill_attention / shape.prefill_tokens if shape.prefill_tokens else 0.0
    return extend, span


def model_from_dict(data: dict[str, Any]) -> LatencyModel:
    """The inverse of ``to_dict``; raises ValueError on an unknown form or missing coefficient.
    Echo's extensions default to zero, so a model with the paper's coefficients only loads."""
    form = data.get("form")
    coefficients = data.get("coefficients") or {}
    try:
        if form == "echo":
            return EchoLatencyModel(
                **{
                    attribute: float(
                        coefficients[name] if name in ECHO_PAPER_COEFFICIENTS else coefficients.get(name, 0.0)
                    )
                    for name, attribute in ECHO_COEFFICIENTS.items()
                }
            )
        if form in LINEAR_FEATURES:
            return LinearLatencyModel(form, tuple(float(coefficients[name]) for name in LINEAR_FEATURES[form][0]))
    except KeyError as missing:
        raise ValueError(f"latency model {form!r} lacks coefficient {missing}") from None
    raise ValueError(f"unknown latency model form {form!r}; known: {', '.join(FORMS)}")


def _least_squares(
    rows: list[list[float]], times: Sequence[float] | np.ndarray, nonnegative: bool = False
) -> np.ndarray:
    """Least squares on relative error (each row divided by its time), since batches span
    milliseconds to seconds and the score is a percentage error; columns are scaled because
    S_p² and a constant column differ by ~10⁷. ``nonnegative`` solves it exactly over every
    subset of columns (the forms that ask have at most five): a cost term cannot be negative."""
    target = np.asarray(times, dtype=float)
    weight = 1.0 / np.maximum(target, 1e-9)
    matrix = np.asarray(rows, dtype=float) * weight[:, None]
    scale = np.abs(matrix).max(axis=0)
    scale[scale == 0] = 1.0
    matrix, target = matrix / scale, target * weight
    if not nonnegative:
        solution, *_ = np.linalg.lstsq(matrix, target, rcond=None)
        return solution / scale
    best, best_error = np.zeros(matrix.shape[1]), float(np.dot(target, target))
    for size in range(1, matrix.shape[1] + 1):
        for columns in itertools.combinations(range(matrix.shape[1]), size):
            partial, *_ = np.linalg.lstsq(matrix[:, columns], target, rcond=None)
            if np.any(partial < 0):
                continue
            residual = target - matrix[:, columns] @ partial
            if (error := float(np.dot(residual, residual))) < best_error:
                best, best_error = np.zeros(matrix.shape[1]), error
                best[list(columns)] = partial
    return best / scale


def fit_linear(form: str, shapes: Sequence[BatchShape], times: Sequence[float]) -> LinearLatencyModel:
    features = LINEAR_FEATURES[form][1]
    return LinearLatencyModel(form, tuple(float(x) for x in _least_squares([features(s) for s in shapes], times)))


MIXED_DECODE_SHARES = np.linspace(0.0, 1.0, 11)


def fit_echo(shapes: Sequence[BatchShape], times: Sequence[float]) -> EchoLatencyModel:
    """Fit each of Echo's parts on the batches that isolate it, as the paper's micro-benchmarks
    do: prefill-only batches give the per-request curve and its floor, decode-only batches the
    decode part, mixed batches ``decode_as_prefill`` and λ."""
    prefill = [(s, t) for s, t in zip(shapes, times) if s.prefill_reqs and not s.decode_reqs]
    decode = [(s, t) for s, t in zip(shapes, times) if s.decode_reqs and not s.prefill_reqs]
    mixed = [(s, t) for s, t in zip(shapes, times) if s.decode_reqs and s.prefill_reqs]
    if len(prefill) < 3 or len(decode) < 2:
        raise ValueError("Echo's form needs at least 3 prefill-only and 2 decode-only batches")
    base, per_request, per_token, gamma, delta = _least_squares(
        [_echo_decode_row(s) for s, _ in decode], [t for _, t in decode], nonnegative=True
    )
    model = replace(
        _fit_prefill_requests(prefill),
        decode_base=float(base),
        decode_per_request=float(per_request),
        decode_per_token=float(per_token),
        gamma=float(gamma),
        delta=float(delta),
    )
    if not mixed:
        return model
    fits = [_fit_mix(replace(model, decode_as_prefill=float(share)), mixed) for share in MIXED_DECODE_SHARES]
    return min(fits, key=lambda fitted: _squared_relative_error(fitted.predict, mixed))


def _fit_mix(model: EchoLatencyModel, mixed: list[tuple[BatchShape, float]]) -> EchoLatencyModel:
    """λ in closed form (least relative squares), clipped to the paper's [0, 1]."""
    parts = np.asarray([(model.mixed_prefill_time(shape), model.decode_time(shape)) for shape, _ in mixed])
    high, low = parts.max(axis=1), parts.min(axis=1)
    weight = 1.0 / np.asarray([time for _, time in mixed])
    spread = (high - low) * weight
    above_low = (np.asarray([time for _, time in mixed]) - low) * weight
    denominator = float(np.dot(spread, spread))
    mix = float(np.dot(above_low, spread) / denominator) if denominator else 1.0
    return replace(model, mix=min(max(mix, 0.0), 1.0))


def _echo_decode_row(shape: BatchShape) -> list[float]:
    return [
        1.0,
        float(shape.decode_reqs),
        float(shape.decode_context),
        float(shape.decode_max_context),
        shape.decode_context / shape.decode_reqs,
    ]


FLOOR_STARTS = 6
FLOOR_ROUNDS = 20


def _prefill_requests(shape: BatchShape) -> list[tuple[float, float]]:
    """Each prefill request's ``(extend, span)``, read as `EchoLatencyModel.prefill_time` does."""
    if shape.prefill_chunks:
        return [(float(extend), float(extend + prefix)) for extend, prefix in shape.prefill_chunks]
    return [_equal_share(shape)] * shape.prefill_reqs


def _prefill_row(requests: list[tuple[float, float]], floored: list[bool]) -> list[float]:
    rising = [request for request, low in zip(requests, floored) if not low]
    return [
        sum(span * span for _, span in rising),
        sum(extend * span for extend, span in rising),
        sum(extend for extend, _ in rising),
        float(len(requests) - len(rising)),
        1.0,
    ]


def _fit_prefill_requests(samples: list[tuple[BatchShape, float]]) -> EchoLatencyModel:
    """The per-request curve ``max(α l² + β l, c)`` summed over a batch, plus ``prefill_base``.
    Which requests sit on the floor depends on the curve, so the fit alternates: solve for the
    coefficients with the floored requests fixed (then the batch time is linear in them), floor
    each request whose curve falls below ``c``, repeat until nothing moves. It starts from
    several guesses (nothing floored, or every request up to a quantile of the lengths) and keeps
    the least relative error."""
    requests = [_prefill_requests(shape) for shape, _ in samples]
    times = np.asarray([time for _, time in samples], dtype=float)
    extends = np.asarray([extend for batch in requests for extend, _ in batch])
    starts = (-1.0, *np.unique(np.quantile(extends, np.linspace(0.0, 0.5, FLOOR_STARTS))))
    fits = [_refloor_until_stable(requests, times, start) for start in starts]
    return min(fits, key=lambda model: _squared_relative_error(model.prefill_time, samples))


def _refloor_until_stable(
    requests: list[list[tuple[float, float]]], times: np.ndarray, start: float
) -> EchoLatencyModel:
    floored = [[extend <= start for extend, _ in batch] for batch in requests]
    for _ in range(FLOOR_ROUNDS):
        alpha, alpha_chunk, beta, floor, base = _least_squares(
            [_prefill_row(batch, low) for batch, low in zip(requests, floored)], times, nonnegative=True
        )
        model = EchoLatencyModel(
            float(alpha),
            float(beta),
            float(floor),
            0.0,
            0.0,
            1.0,
            alpha_chunk=float(alpha_chunk),
            prefill_base=float(base),
        )
        refloored = [[model.request_work(extend, span) < model.floor for extend, span in batch] for batch in requests]
        if refloored == floored:
            break
        floored = refloored
    return model


def _squared_relative_error(predict: Callable[[BatchShape], float], samples: list[tuple[BatchShape, float]]) -> float:
    relative = np.asarray([predict(shape) / time - 1.0 for shape, time in samples])
    return float(np.dot(relative, relative))


def fit(form: str, shapes: Sequence[BatchShape], times: Sequence[float]) -> LatencyModel:
    if form == "echo":
        return fit_echo(shapes, times)
    if form in LINEAR_FEATURES:
        return fit_linear(form, shapes, times)
    raise ValueError(f"unknown latency model form {form!r}; known: {', '.join(FORMS)}")


BATCH_KINDS = ("prefill", "decode", "mixed")


def batch_kind(shape: BatchShape) -> str:
    """Which of Echo's three cases a batch is; each is scored apart because decode-only batches
    are most of a profile and would hide a form that mispredicts the other two."""
    if shape.prefill_reqs and shape.decode_reqs:
        return "mixed"
    return "prefill" if shape.prefill_reqs else "decode"


def mape(model: LatencyModel, shapes: Sequence[BatchShape], times: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction (0.05 is 5%)."""
    errors = [abs(model.predict(s) - t) / t for s, t in zip(shapes, times) if t > 0]
    return float(np.mean(errors)) if errors else float("nan")


def mape_by_kind(model: LatencyModel, shapes: Sequence[BatchShape], times: Sequence[float]) -> dict[str, float]:
    """`mape` of each `batch_kind` present."""
    scores = {}
    for kind in BATCH_KINDS:
        chosen = [index for index, shape in enumerate(shapes) if batch_kind(shape) == kind]
        if chosen:
            scores[kind] = mape(model, [shapes[i] for i in chosen], [times[i] for i in chosen])
    return scores


@dataclass
class FitReport:
    """Every form fitted on the same training batches and scored on the same held-out ones."""

    models: dict[str, LatencyModel]
    train_mape: dict[str, float]
    holdout_mape: dict[str, float]
    train_batches: int
    holdout_batches: int
    errors: dict[str, str] = field(default_factory=dict)
    holdout_mape_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    def best_form(self) -> str:
        return min(self.holdout_mape, key=lambda form: self.holdout_mape[form])

    def to_dict(self) -> dict[str, Any]:
        return {
            "train_batches": self.train_batches,
            "holdout_batches": self.holdout_batches,
            "best": self.best_form() if self.holdout_mape else None,
            "forms": {
                form: {
                    **model.to_dict(),
                    "train_mape": self.train_mape[form],
                    "holdout_mape": self.holdout_mape[form],
                    "holdout_mape_by_kind": self.holdout_mape_by_kind.get(form, {}),
                }
                for form, model in self.models.items()
            },
            "errors": self.errors,
        }


def fit_forms(
    shapes: Sequence[BatchShape],
    times: Sequence[float],
    holdout_fraction: float = 0.25,
    seed: int = 0,
    forms: Sequence[str] = FORMS,
) -> FitReport:
    """Fit each form on a seeded random split; a form that cannot be fitted is reported, not fatal."""
    if len(shapes) != len(times) or len(shapes) < 8:
        raise ValueError(f"need at least 8 timed batches with shapes, got {len(shapes)} shapes, {len(times)} times")
    order = np.random.default_rng(seed).permutation(len(shapes))
    cut = max(1, int(round(len(shapes) * holdout_fraction)))
    holdout, train = order[:cut], order[cut:]
    train_shapes, train_times = [shapes[i] for i in train], [times[i] for i in train]
    holdout_shapes, holdout_times = [shapes[i] for i in holdout], [times[i] for i in holdout]
    report = FitReport({}, {}, {}, len(train), len(holdout))
    for form in forms:
        try:
            model = fit(form, train_shapes, train_times)
        except ValueError as error:
            report.errors[form] = str(error)
            continue
        report.models[form] = model
        report.train_mape[form] = mape(model, train_shapes, train_times)
        report.holdout_mape[form] = mape(model, holdout_shapes, holdout_times)
        report.holdout_mape_by_kind[form] = mape_by_kind(model, holdout_shapes, holdout_times)
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


def max_prefill(
    model: Predictor,
    budget_s: float,
    batch: BatchShape,
    extend: int,
    prefix: int,
    chunk_tokens: int,
    memory_tokens: int,
) -> tuple[int, float]:
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
