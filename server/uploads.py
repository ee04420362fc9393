"""Receiving a ``multipart/form-data`` upload straight to disk, with every part of it capped.

The body is parsed as it arrives (python-multipart's streaming parser), so a 200 MB file never
sits in memory, and nothing a client sends can grow memory or disk past a cap: the file part is
cut at the file limit, every other form field at `MAX_FORM_FIELD_BYTES`, each part's headers at
`MAX_PART_HEADER_BYTES`, the number of parts at `MAX_FORM_PARTS`, and the whole body at the file
limit plus `FORM_OVERHEAD_BYTES` however it is split into parts. A declared Content-Length over
that total is refused before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FILE_FIELD = "file"
MAX_FORM_FIELD_BYTES = 64 * 1024
MAX_PART_HEADER_BYTES = 16 * 1024
# ``file``, ``purpose``, ``expires_after[anchor]``, ``expires_after[seconds]`` and room to spare.
MAX_FORM_PARTS = 16
# Room for the multipart framing and the small fields around the file itself.
FORM_OVERHEAD_BYTES = MAX_FORM_PARTS * (MAX_FORM_FIELD_BYTES + MAX_PART_HEADER_BYTES)


class UploadTooLarge(Exception):
    """Some part of the upload passed its cap: ``param`` names the field (``file`` for the file
    itself or the body as a whole), ``limit`` the cap in bytes."""

    def __init__(self, message: str, *, param: str, limit: int) -> None:
        super().__init__(message)
        self.param = param
        self.limit = limit


class BadUpload(Exception):
    pass


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    bytes: int = 0


class _FormReceiver:
    """python-multipart callbacks: the ``file`` part goes to ``destination``, other parts to ``fields``."""

    def __init__(self, destination: Path, max_file_bytes: int) -> None:
        self.destination = destination
        self.max_file_bytes = max_file_bytes
        self.upload = Upload()
        self.file_too_large = False
        self._parts = 0
        self._header_bytes = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._field_name: str | None = None
        self._field_value = bytearray()
        self._file: BinaryIO | None = None

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field_data,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_FORM_PARTS:
            raise UploadTooLarge(f"the form has more than {MAX_FORM_PARTS} parts", param="file", limit=MAX_FORM_PARTS)
        self._headers = {}
        self._header_bytes = 0
        self._field_name = None
        self._field_value = bytearray()

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise UploadTooLarge(
                f"a form part's headers are longer than {MAX_PART_HEADER_BYTES} bytes",
                param="file",
                limit=MAX_PART_HEADER_BYTES,
            )

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._header_name).lower()] = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        _kind, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._field_name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._field_name == FILE_FIELD and b"filename" in options:
            if self._file is not None:
                raise BadUpload("only one file may be uploaded per request")
            self.upload.filename = options[b"filename"].decode("utf-8", "replace")
            self._file = self.destination.open("wb")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None and self._field_name == FILE_FIELD and not self._file.closed:
            self.upload.bytes += end - start
            if self.upload.bytes > self.max_file_bytes:
                self.file_too_large = True
            elif not self.file_too_large:
                self._file.write(data[start:end])
            return
        self._field_value += data[start:end]
        if len(self._field_value) > MAX_FORM_FIELD_BYTES:
            raise UploadTooLarge(
                f"form field {self._field_name!r} is longer than {MAX_FORM_FIELD_BYTES} bytes",
                param=self._field_name or "file",
                limit=MAX_FORM_FIELD_BYTES,
            )

    def _part_end(self) -> None:
        if self._file is not None and self._field_name == FILE_FIELD and not self._file.closed:
            self._file.close()
        elif self._field_name:
            self.upload.fields[self._field_name] = self._field_value.decode("utf-8", "replace")

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


async def receive_upload(request: Request, destination: Path, max_file_bytes: int) -> Upload:
    """Stream the form's ``file`` part into ``destination``; raise `UploadTooLarge` past any cap and
    `BadUpload` for a body that is not a form with one file. The caller removes ``destination``
    on an exception."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data" or b"boundary" not in options:
        raise BadUpload("the upload must be multipart/form-data with a 'file' part and a 'purpose' field")
    max_body = max_file_bytes + FORM_OVERHEAD_BYTES
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise _file_too_large(max_file_bytes)
    receiver = _FormReceiver(destination, max_file_bytes)
    parser = MultipartParser(options[b"boundary"], receiver.callbacks())
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_body:
                raise _file_too_large(max_file_bytes)
            parser.write(chunk)
            # A body of declared length (within the total cap) is read to its end, so the client
            # reads the 413 instead of a connection reset; one of unknown length stops here.
            if receiver.file_too_large and declared is None:
                break
        if not receiver.file_too_large:
            parser.finalize()
    except ValueError as error:
        raise BadUpload(f"malformed multipart body: {error}") from error
    finally:
        receiver.close()
    if receiver.file_too_large:
        raise _file_too_large(max_file_bytes)
    if receiver.upload.filename is None:
        raise BadUpload("the form has no 'file' part")
    return receiver.upload


def _file_too_large(max_file_bytes: int) -> UploadTooLarge:
    return UploadTooLarge(
        f"the file is larger than this server's limit of {max_file_bytes} bytes", param="file", limit=max_file_bytes
    )
