"""A shuffled document-QA file, planned globally, computes each shared prefix once in SGLang's real
scheduler on the emulated H100, with SGLang's overlap scheduler on (its default).

Under the overlap scheduler a request admitted one iteration after another with the same document
does not yet find that document in the radix cache: the forward computing it has not been
processed, or, for a document prefilled in chunks, not all of them. Without the plan's prefix-once
rule such a request computes the document again, and the job's cached tokens fall short of the
ideal by a document's length each time. The runner's window is kept small, so a family's lines
reach the engine a few at a time, as they do when it refills a full engine. The ideal is
`workloads.ideal_sharing` over the same file: every distinct prompt prefix computed once.
"""

from __future__ import annotations


import pytest

from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobOptions, JobTotals
from sgl_blend.workloads.batch_files import write_jsonl
from sgl_blend.workloads.docqa import docqa_lines
from sgl_blend.workloads.ideal_sharing import IdealSharing, ideal_sharing
from tests.conftest import free_port

pytestmark = pytest.mark.server

LINES = 240
MODEL = "llama-3.1-8b"
WINDOW = 32


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobTotals, IdealSharing]:
    root = tmp_path_factory.mktemp("docqa-sharing")
    batch_file = write_jsonl(root / "batch.jsonl", docqa_lines(LINES, 3))
    totals, _state = run_on_fresh_server(MODEL, "blendserve", batch_file, root / "out.jsonl", root / "errors.jsonl",
                                 sglang_args=["--port", str(free_port())], emulate="h100",
                                 server_log=root / "server.log", options=JobOptions(max_inflight=WINDOW, show_progress=False))
    return totals, ideal_sharing(batch_file, MODEL)


def test_every_line_is_answered(job: tuple[JobTotals, IdealSharing]) -> None:
    totals, ideal = job
    assert (totals.completed, totals.failed) == (LINES, 0)
    assert totals.usage.prompt_tokens == ideal.prompt_tokens


def test_each_shared_prefix_is_computed_once(job: tuple[JobTotals, IdealSharing]) -> None:
    totals, ideal = job
    # The only tokens a plan may miss are the chat template's opening ones that lines of
    # different families share: lines admitted in the same first batch each compute them.
    assert ideal.cached_tokens - totals.cached_tokens <= 32 * 64
    assert totals.cached_tokens / ideal.cached_tokens >= 0.99
