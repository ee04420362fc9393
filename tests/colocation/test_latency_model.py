"""The latency predictor: each form recovers known coefficients from synthetic batches, and
`max_prefill` returns the longest chunk that keeps the batch within budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sgl_blend.core.latency_model import (
    BatchShape, EchoLatencyModel, LinearLatencyModel, fit, fit_forms, load_model, max_prefill, model_from_dict,
)


def random_shapes(count: int, seed: int = 0) -> list[BatchShape]:
    """Prefill-only, decode-only and mixed batches, as the profiling grid produces them."""
    rng = np.random.default_rng(seed)
    shapes = []
    for index in range(count):
        shape = BatchShape()
        kind = index % 3
        if kind in (0, 2):
            for _ in range(int(rng.integers(1, 4))):
                shape = shape.with_prefill(int(rng.integers(16, 1024)), int(rng.integers(0, 512)))
        if kind in (1, 2):
            for _ in range(int(rng.integers(1, 32))):
                shape = shape.with_decode(int(rng.integers(32, 2048)))
        shapes.append(shape)
    return shapes


HYGEN_TRUE = (2e-3, 3e-5, 2e-6, 4e-9, 1e-11, 5e-4, 1e-4)


@pytest.mark.parametrize("form, truth", [
    ("hygen", HYGEN_TRUE),
    ("bros", (1e-3, 2e-5, 3e-9, 2e-3, 1e-4, 2e-7)),
])
def test_linear_forms_recover_known_coefficients(form: str, truth: tuple[float, ...]) -> None:
    shapes = random_shapes(600)
    model = LinearLatencyModel(form, truth)
    rng = np.random.default_rng(1)
    times = [model.predict(s) * (1 + rng.normal(0, 0.002)) for s in shapes]
    fitted = fit(form, shapes, times)
    assert isinstance(fitted, LinearLatencyModel)
    for got, want in zip(fitted.coefficients, truth):
        assert got == pytest.approx(want, rel=0.15), (form, fitted.coefficients)


def test_echo_form_recovers_known_coefficients() -> None:
    truth = EchoLatencyModel(alpha=2e-8, beta=4e-5, floor=3e-3, gamma=2e-6, delta=5e-6, mix=0.7)
    shapes = random_shapes(900, seed=3)
    times = [truth.predict(s) for s in shapes]
    fitted = fit("echo", shapes, times)
    assert isinstance(fitted, EchoLatencyModel)
    for name in ("alpha", "beta", "floor", "gamma", "delta", "mix"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_fit_forms_scores_holdout_and_round_trips(tmp_path) -> None:
    shapes = random_shapes(300)
    model = LinearLatencyModel("hygen", HYGEN_TRUE)
    times = [model.predict(s) for s in shapes]
    report = fit_forms(shapes, times)
    assert report.holdout_batches == 75 and report.train_batches == 225
    assert report.holdout_mape["hygen"] < 1e-6
    assert report.best_form() == "hygen"
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(report.to_dict()))
    loaded = load_model(path)
    assert loaded.predict(shapes[0]) == pytest.approx(times[0])
    for form in ("echo", "bros"):
        again = model_from_dict(report.models[form].to_dict())
        assert again.predict(shapes[5]) == pytest.approx(report.models[form].predict(shapes[5]))


def test_unknown_form_and_missing_coefficient_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown latency model form"):
        model_from_dict({"form": "vidur", "coefficients": {}})
    with pytest.raises(ValueError, match="lacks coefficient"):
        model_from_dict({"form": "hygen", "coefficients": {"intercept": 1.0}})


def test_max_prefill_is_the_longest_chunk_within_every_budget() -> None:
    model = LinearLatencyModel("hygen", (0.001, 1e-5, 0.0, 1e-8, 0.0, 0.0, 0.0))
    batch = BatchShape().with_decode(100)
    chunk, predicted = max_prefill(model, 0.005, batch, extend=5000, prefix=0, chunk_tokens=4096, memory_tokens=4096)
    assert predicted <= 0.005
    assert model.predict(batch.with_prefill(chunk + 1)) > 0.005
    assert max_prefill(model, 1.0, batch, 300, 0, chunk_tokens=100, memory_tokens=4096)[0] == 100
    assert max_prefill(model, 1.0, batch, 300, 0, chunk_tokens=4096, memory_tokens=50)[0] == 50
    assert max_prefill(model, 0.0005, batch, 300, 0, 4096, 4096)[0] == 0
