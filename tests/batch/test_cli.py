"""`sgl-blend batch` against the shared server, as a user runs it: the server and key come from
``$SGLBLEND_URL`` / ``$SGLBLEND_API_KEY``. The command runs in this process (`sgl_blend.cli.main`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_blend.cli import main
from sgl_blend.client.http import API_KEY_ENV, URL_ENV
from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.batch.helpers import chat_lines, jsonl


class Cli:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str) -> None:
        self.monkeypatch, self.capsys = monkeypatch, capsys
        monkeypatch.setenv(URL_ENV, url)

    def __call__(self, *args: str, key: str | None = API_KEY) -> tuple[int, str, str]:
        """``sgl-blend batch ARGS``: its exit status, stdout and stderr."""
        if key:
            self.monkeypatch.setenv(API_KEY_ENV, key)
        else:
            self.monkeypatch.delenv(API_KEY_ENV, raising=False)
        self.capsys.readouterr()
        status = main(["batch", *args])
        out, err = self.capsys.readouterr()
        return status, out, err


@pytest.mark.server
def test_submit_wait_status_list_download_cancel(batch_server: ServerProcess, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sgl_blend = Cli(monkeypatch, capsys, batch_server.base_url)
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([*chat_lines(5, "cli"), "{not json"]))

    status, out, err = sgl_blend("submit", str(source), "--wait", "-o", str(tmp_path / "out"), "--metadata", "run=cli")
    assert status == 0, err[-2000:]
    batch_id = out.splitlines()[0]
    assert batch_id.startswith("batch_")
    output, errors = tmp_path / "out" / f"{batch_id}_output.jsonl", tmp_path / "out" / f"{batch_id}_errors.jsonl"
    assert sorted(json.loads(line)["custom_id"] for line in output.read_text().splitlines()) == \
        [f"cli-{index}" for index in range(5)]
    assert json.loads(errors.read_text())["error"]["code"] == "invalid_json"

    status, out, _err = sgl_blend("status", batch_id)
    batch = json.loads(out)
    assert status == 0 and batch["status"] == "completed" and batch["metadata"] == {"run": "cli"}
    assert batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    status, out, _err = sgl_blend("list", "--limit", "5")
    assert status == 0 and batch_id in out

    status, _out, _err = sgl_blend("download", batch_id, "-o", str(tmp_path / "again"))
    assert status == 0 and (tmp_path / "again" / output.name).read_bytes() == output.read_bytes()

    status, _out, err = sgl_blend("cancel", batch_id)
    assert status == 1 and "409" in err
    status, _out, err = sgl_blend("status", batch_id, key=None)
    assert status == 1 and "401" in err


def test_a_missing_action_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["batch"])
    assert exit_.value.code == 2 and "the following arguments are required: ACTION" in capsys.readouterr().err
