"""What the Batch API's routes promise at the edge, on a real HTTP server of the routes alone (no
engine is needed for any of it, `tests.batch.api_only`): files and batches belong to the key that
made them, the admin key sees everyone's, a server with only the admin key is not open, browsers
are refused unless their origin is allowed, and every body is capped with a 413 in OpenAI's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from sgl_blend.client import http
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.uploads import MAX_FORM_FIELD_BYTES, MAX_FORM_PARTS
from tests.batch.api_only import api_only_server
from tests.batch.helpers import chat_lines, jsonl

ALICE, BOB, ADMIN = "sk-alice", "sk-bob", "sk-admin"
ALLOWED_ORIGIN = "https://notebooks.example"
MAX_FILE_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("api-edge")
    config = BatchApiConfig(data_dir=root / "data", max_file_bytes=MAX_FILE_BYTES, cors_origins=(ALLOWED_ORIGIN,))
    with api_only_server(config, BatchKeys((ALICE, BOB), ADMIN), root / "api.log") as (url, _pid):
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_files_and_batches_belong_to_their_key(api: str) -> None:
    alice, bob, admin = client(api, ALICE), client(api, BOB), client(api, ADMIN)
    mine = alice.files.create(file=("in.jsonl", jsonl(chat_lines(2, "own"))), purpose="batch")
    batch = alice.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h")

    for read in (lambda: bob.files.retrieve(mine.id), lambda: bob.files.content(mine.id),
                 lambda: bob.files.delete(mine.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError):
            read()
    with pytest.raises(openai.BadRequestError) as borrowed:
        bob.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert borrowed.value.body["code"] == "invalid_input_file"
    assert mine.id not in {f.id for f in bob.files.list()} and batch.id not in {b.id for b in bob.batches.list()}

    assert mine.id in {f.id for f in alice.files.list()} and alice.batches.retrieve(batch.id).id == batch.id
    assert mine.id in {f.id for f in admin.files.list()} and batch.id in {b.id for b in admin.batches.list()}
    assert admin.batches.cancel(batch.id).status == "cancelling"  # the admin manages everyone's
    assert alice.files.content(mine.id).content == jsonl(chat_lines(2, "own"))


def test_a_wrong_or_missing_key_is_refused_in_openais_shape(api: str) -> None:
    for key in ("sk-wrong", ALICE + "x"):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(api, key).batches.list()
        assert refused.value.body["code"] == "invalid_api_key"
    assert httpx.get(api + "/v1/files").status_code == 401
    assert httpx.get(api + "/v1/files", headers={"Authorization": ALICE}).status_code == 401  # not a Bearer token


def test_a_server_with_only_the_admin_key_is_not_open(tmp_path: Path) -> None:
    with api_only_server(BatchApiConfig(data_dir=tmp_path / "data"), BatchKeys((), ADMIN), tmp_path / "api.log") \
            as (url, _pid):
        assert httpx.get(url + "/v1/batches").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            client(url, "sk-anything").files.list()
        assert client(url, ADMIN).batches.list().data == []


def test_browsers_only_from_allowed_origins(api: str) -> None:
    form = {"files": {"file": ("in.jsonl", jsonl(chat_lines(1, "web")))}, "data": {"purpose": "batch"}}
    before = {f.id for f in client(api, ADMIN).files.list()}
    # A page elsewhere posting a form (a request no CORS preflight guards) does not create anything.
    foreign = httpx.post(api + "/v1/files", headers={**http.auth_headers(ALICE), "Origin": "https://evil.example"},
                         **form)
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
    rebound = httpx.get(api + "/v1/files", headers={**http.auth_headers(ALICE), "Sec-Fetch-Site": "same-origin"})
    assert rebound.status_code == 403  # a page's own request: a DNS-rebound page, since none is served here
    assert {f.id for f in client(api, ADMIN).files.list()} == before

    preflight = httpx.options(api + "/v1/files", headers={"Origin": ALLOWED_ORIGIN,
                                                          "Access-Control-Request-Method": "POST",
                                                          "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    allowed = httpx.post(api + "/v1/files", headers={**http.auth_headers(ALICE), "Origin": ALLOWED_ORIGIN}, **form)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert httpx.get(api + "/v1/files", headers={**http.auth_headers(ALICE), "Sec-Fetch-Site": "none"}).status_code \
        == 200  # typed into the address bar


def test_every_part_of_a_body_is_capped(api: str) -> None:
    auth = http.auth_headers(ALICE)
    small = ("in.jsonl", jsonl(chat_lines(1, "cap")))

    def upload(headers: dict[str, str] | None = None, **kwargs) -> httpx.Response:
        return httpx.post(api + "/v1/files", headers={**auth, **(headers or {})}, **kwargs)

    too_big = upload(files={"file": ("big.jsonl", b"x" * (MAX_FILE_BYTES + 1))}, data={"purpose": "batch"})
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "file_too_large"
    long_field = upload(files={"file": small}, data={"purpose": "batch", "note": "y" * (MAX_FORM_FIELD_BYTES + 1)})
    assert long_field.status_code == 413 and long_field.json()["error"] == {
        "message": f"form field 'note' is longer than {MAX_FORM_FIELD_BYTES} bytes", "type": "invalid_request_error",
        "param": "note", "code": "form_field_too_large"}
    many_fields = upload(files={"file": small},
                         data={"purpose": "batch", **{f"f{index}": "z" for index in range(MAX_FORM_PARTS)}})
    assert many_fields.status_code == 413

    def endless_body():  # no Content-Length: the cap holds on what arrives
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n"
        for _ in range(4 * MAX_FILE_BYTES // 4096):
            yield b"x" * 4096

    chunked = upload(content=endless_body(), headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert chunked.status_code == 413

    huge_batch = httpx.post(api + "/v1/batches", headers={**auth, "Content-Type": "application/json"},
                            content=b'{"metadata": "' + b"m" * 100_000 + b'"}')
    assert huge_batch.status_code == 413 and huge_batch.json()["error"]["code"] == "request_too_large"
    assert upload(files={"file": small}, data={"purpose": "batch"}).status_code == 200


def test_serve_flags_configure_the_keys_origins_and_caps(tmp_path: Path) -> None:
    from sgl_blend.cli import build_parser
    from sgl_blend.commands.serve import batch_api_config

    keys_file = tmp_path / "keys"
    keys_file.write_text("# team keys\nsk-c\n\n  sk-d  # the data team\n")
    args = build_parser().parse_args(["serve", "--model", "m", "--batch-api-keys", "sk-a,sk-b", "--batch-api-keys-file",
                                      str(keys_file), "--batch-cors-origins", "https://a.example/,*",
                                      "--batch-max-n", "2", "--batch-max-tokens", "512"])
    config = batch_api_config(args)
    assert config.api_keys == ("sk-a", "sk-b", "sk-c", "sk-d") and config.cors_origins == ("https://a.example", "*")
    assert (config.max_n, config.max_tokens) == (2, 512)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m", "--batch-cors-origins", "evil.example"])
