"""Errors in OpenAI's JSON shape, so the `openai` client raises its own typed exceptions for them."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No {kind} with id {object_id!r}", code="not_found")


async def api_error_handler(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return JSONResponse(error.body(), status_code=error.status)
