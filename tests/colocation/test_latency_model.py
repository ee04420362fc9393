"""The latency predictor: each form recovers known coefficients from synthetic batches, Echo's
costs each prefill request apart (its floor, its cached prefix, a shape without chunks), and
`max_prefill` returns the longest chunk that keeps the batch within budget."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sgl_blend.core.latency_model import (
    ECHO_COEFFICIENTS, BatchShape, EchoLatencyModel, LinearLatencyModel, fit, fit_forms, load_model, max_prefill,
    model_from_dict,
)
from sgl_blend.measure.latency_profile import format_report, latency_grid


def per_request_shapes(count: int, seed: int = 0) -> list[BatchShape]:
    """Prefill-only, decode-only and mixed batches whose requests differ from each other: short
    and long prompts in one batch (so some sit on the floor and some do not), some on a cached
    prefix, decode contexts spread apart (so the longest is not the mean)."""
    rng = np.random.default_rng(seed)
    shapes = []
    for index in range(count):
        shape = BatchShape()
        kind = index % 3
        if kind in (0, 2):
            for _ in range(int(rng.integers(1, 5))):
                prefix = int(rng.integers(0, 1024)) if rng.random() < 0.4 else 0
                shape = shape.with_prefill(int(np.exp(rng.uniform(np.log(4), np.log(2048)))), prefix)
        if kind in (1, 2):
            for _ in range(int(rng.integers(1, 33))):
                shape = shape.with_decode(int(rng.integers(16, 2048)))
        shapes.append(shape)
    return shapes


HYGEN_TRUE = (2e-3, 3e-5, 2e-6, 4e-9, 1e-11, 5e-4, 1e-4)


@pytest.mark.parametrize("form, truth", [
    ("hygen", HYGEN_TRUE),
    ("bros", (1e-3, 2e-5, 3e-9, 2e-3, 1e-4, 2e-7)),
])
def test_linear_forms_recover_known_coefficients(form: str, truth: tuple[float, ...]) -> None:
    shapes = per_request_shapes(600)
    model = LinearLatencyModel(form, truth)
    rng = np.random.default_rng(1)
    times = [model.predict(s) * (1 + rng.normal(0, 0.002)) for s in shapes]
    fitted = fit(form, shapes, times)
    assert isinstance(fitted, LinearLatencyModel)
    for got, want in zip(fitted.coefficients, truth):
        assert got == pytest.approx(want, rel=0.15), (form, fitted.coefficients)


ECHO_TRUE = EchoLatencyModel(alpha=6e-9, beta=2e-5, floor=1.5e-3, gamma=2e-6, delta=5e-6, mix=0.8,
                             alpha_chunk=3e-9, prefill_base=2e-3, decode_base=1.8e-3, decode_per_request=1.5e-4,
                             decode_per_token=4e-7, decode_as_prefill=0.6)


def test_echo_form_recovers_known_per_request_coefficients() -> None:
    shapes = per_request_shapes(900, seed=3)
    rng = np.random.default_rng(4)
    times = [ECHO_TRUE.predict(s) * (1 + rng.normal(0, 0.002)) for s in shapes]
    fitted = fit("echo", shapes, times)
    assert isinstance(fitted, EchoLatencyModel)
    for name in ECHO_COEFFICIENTS.values():
        assert getattr(fitted, name) == pytest.approx(getattr(ECHO_TRUE, name), rel=0.1), name


def test_echo_paper_form_is_recovered_without_the_extensions() -> None:
    """Data made by the paper's form alone fits back to it: the extensions come out at zero
    instead of sharing the work with the paper's terms."""
    paper = EchoLatencyModel(alpha=6e-9, beta=2e-5, floor=1.5e-3, gamma=2e-6, delta=5e-6, mix=0.8)
    shapes = per_request_shapes(900, seed=5)
    fitted = fit("echo", shapes, [paper.predict(s) for s in shapes])
    for name in ("alpha", "beta", "floor", "gamma", "delta", "mix"):
        assert getattr(fitted, name) == pytest.approx(getattr(paper, name), rel=0.02), name
    for name in ("alpha_chunk", "prefill_base", "decode_base", "decode_per_request", "decode_per_token",
                 "decode_as_prefill"):
        assert getattr(fitted, name) == pytest.approx(0.0, abs=1e-12), name


def test_echo_floor_applies_to_each_prefill_request() -> None:
    model = EchoLatencyModel(alpha=0.0, beta=1e-5, floor=1e-3, gamma=0.0, delta=0.0, mix=1.0, prefill_base=5e-3)
    tiny = BatchShape().with_prefill(10)
    assert model.predict(tiny) == pytest.approx(5e-3 + 1e-3)
    assert model.predict(tiny.with_prefill(10).with_prefill(10)) == pytest.approx(5e-3 + 3 * 1e-3)
    assert model.predict(tiny.with_prefill(1000)) == pytest.approx(5e-3 + 1e-3 + 1000 * 1e-5)


def test_echo_prefill_attention_is_per_request_and_reads_the_cached_prefix() -> None:
    """Two 100-token requests cost two 100² squares, not one 200² square; a request on a cached
    prefix pays its whole span on ``alpha`` and its chunk on ``alpha_chunk``."""
    squares = EchoLatencyModel(alpha=1e-8, beta=0.0, floor=0.0, gamma=0.0, delta=0.0, mix=1.0)
    assert squares.predict(BatchShape().with_prefill(100).with_prefill(100)) == pytest.approx(2 * 100 ** 2 * 1e-8)
    assert squares.predict(BatchShape().with_prefill(10, prefix=90)) == pytest.approx(100 ** 2 * 1e-8)
    chunks = replace(squares, alpha=0.0, alpha_chunk=1e-8)
    assert chunks.predict(BatchShape().with_prefill(10, prefix=90)) == pytest.approx(10 * 100 * 1e-8)


def test_echo_shape_without_chunks_is_read_as_equal_requests() -> None:
    """BROS packing builds shapes from running sums, which keep no per-request chunks."""
    chunked = BatchShape().with_prefill(100, prefix=50).with_prefill(100, prefix=50).with_decode(300)
    summed = BatchShape(chunked.prefill_tokens, chunked.prefill_reqs, chunked.prefill_attention,
                        chunked.decode_reqs, chunked.decode_context, chunked.decode_max_context)
    assert not summed.prefill_chunks
    assert ECHO_TRUE.predict(summed) == pytest.approx(ECHO_TRUE.predict(chunked))
    floored = EchoLatencyModel(alpha=0.0, beta=1e-5, floor=1e-3, gamma=0.0, delta=0.0, mix=1.0)
    assert floored.predict(BatchShape(prefill_tokens=30, prefill_reqs=3, prefill_attention=300)) == \
        pytest.approx(3 * 1e-3)


def test_echo_decodes_in_a_mixed_batch_count_as_one_token_prefills() -> None:
    """Without the per-request floor: they ride in the batch's forward. Only with the extension:
    the paper's ``P`` holds the prefill requests alone."""
    model = EchoLatencyModel(alpha=1e-8, beta=1e-5, floor=1e-3, gamma=0.0, delta=0.0, mix=1.0,
                             decode_base=1e-3, decode_per_token=1e-7, decode_as_prefill=1.0)
    prefill = BatchShape().with_prefill(200)
    mixed = prefill.with_decode(10).with_decode(10)
    one_token_prefill = 1e-8 * 10 ** 2 + 1e-5
    assert one_token_prefill < model.floor
    assert model.predict(mixed) == pytest.approx(model.predict(prefill) + 2 * one_token_prefill)
    assert replace(model, decode_as_prefill=0.0).predict(mixed) == pytest.approx(model.predict(prefill))


def test_echo_model_round_trips_and_paper_only_coefficients_load() -> None:
    assert model_from_dict(ECHO_TRUE.to_dict()) == ECHO_TRUE
    paper = {"form": "echo", "coefficients": {"alpha": 1e-8, "beta": 2e-5, "c": 1e-3, "gamma": 1e-6, "delta": 2e-6,
                                              "lambda": 0.9}}
    loaded = model_from_dict(paper)
    assert loaded == EchoLatencyModel(alpha=1e-8, beta=2e-5, floor=1e-3, gamma=1e-6, delta=2e-6, mix=0.9)
    del paper["coefficients"]["lambda"]
    with pytest.raises(ValueError, match="lacks coefficient 'lambda'"):
        model_from_dict(paper)


def test_echo_chunk_search_sees_the_prediction_grow() -> None:
    batch = BatchShape().with_decode(500).with_decode(800)
    chunk, predicted = max_prefill(ECHO_TRUE, 0.02, batch, extend=4000, prefix=300, chunk_tokens=4096,
                                   memory_tokens=4096)
    assert 0 < chunk < 4000 and predicted <= 0.02
    assert ECHO_TRUE.predict(batch.with_prefill(chunk + 1, 300)) > 0.02


def test_fit_forms_scores_holdout_and_round_trips(tmp_path) -> None:
    shapes = per_request_shapes(300)
    model = LinearLatencyModel("hygen", HYGEN_TRUE)
    times = [model.predict(s) for s in shapes]
    report = fit_forms(shapes, times)
    assert report.holdout_batches == 75 and report.train_batches == 225
    assert report.holdout_mape["hygen"] < 1e-6
    assert report.best_form() == "hygen"
    assert set(report.holdout_mape_by_kind["echo"]) == {"prefill", "decode", "mixed"}
    assert report.holdout_mape_by_kind["hygen"]["mixed"] < 1e-6
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


def test_profile_grid_spreads_some_decode_contexts_apart() -> None:
    """Without batches whose longest context is far from their mean, Echo's γ max(L) and
    δ mean(L) are the same column and the fit cannot tell them apart."""
    spread = [point for point in latency_grid() if point.context_spread]
    assert spread and all(point.prefills == 0 for point in spread)
    for point in spread:
        contexts = point.decoder_contexts()
        assert len(contexts) == point.decoders
        assert (min(contexts), max(contexts)) == (point.decode_context, point.decode_context + point.context_spread)


def test_profile_report_shows_each_batch_kind_and_reads_older_reports() -> None:
    shapes = per_request_shapes(120)
    report = fit_forms(shapes, [ECHO_TRUE.predict(s) for s in shapes]).to_dict()
    echo_line = next(line for line in format_report(report).splitlines() if line.startswith("echo"))
    assert echo_line.count("%") == 5
    for fitted in report["forms"].values():
        del fitted["holdout_mape_by_kind"]
    echo_line = next(line for line in format_report(report).splitlines() if line.startswith("echo"))
    assert echo_line.count("%") == 2 and echo_line.split()[-3:] == ["-", "-", "-"]
