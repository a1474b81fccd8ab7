"""Every error the server answers, as JSON ``{"error": message, "status": code}`` with that HTTP status."""
from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable, Mapping

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..errors import FULL_DISK_ERRNOS, BudgetError, DiskFullError, EdgeRAGError, InputError, StoreBusy, StoreUnavailable


class NotReady(EdgeRAGError):
    """What was asked cannot be done yet, for a reason the operator can act on (too few labels, labels older than
    the documents): 409 saying so; nothing changed."""


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return error(exc.status_code, exc.detail, exc.headers)  # 429's Retry-After, 405's Allow


async def _input_error(request: Request, exc: InputError) -> Response:
    return error(422 if request.url.path == "/api/documents" else 400, str(exc))


async def _budget_error(request: Request, exc: BudgetError) -> Response:
    return error(507, str(exc))


def disk_full_message(exc: BaseException) -> str | None:
    """What a full disk under a write the store does not make (an upload saved in the temporary folder, a calibration's
    files) says, or None if ``exc`` is not one: it was "internal error: OSError" or "OSError: [Errno 28] ...", 500."""
    if not isinstance(exc, OSError) or exc.errno not in FULL_DISK_ERRNOS:
        return None
    return (f"the disk is full ({exc.strerror}): nothing was saved; free some space on it (uploads are saved in "
            f"{tempfile.gettempdir()} first, the operator's files beside the store or the question log) and try again")


async def _disk_full(request: Request, exc: OSError) -> Response:
    """507 saying so, once (as a 500 it was a traceback in the log per request); any other OSError is the catch-all's."""
    if (message := disk_full_message(exc)) is None:
        raise exc
    return error(507, message)


async def _not_ready(request: Request, exc: NotReady) -> Response:
    return error(409, str(exc))


def status_of(exc: Exception) -> int:
    """The HTTP status of an error the server did not expect of the request: 503 when the store's database cannot be
    reached, a lock wait ran out or another writer holds the store (retry: a load balancer sends the question
    elsewhere, a kiosk asks again, an upload is sent again), 507 when its disk (or a label file's) is full, else 500."""
    return 503 if isinstance(exc, StoreUnavailable | StoreBusy) else 507 if isinstance(exc, DiskFullError) else 500


async def _server_error(request: Request, exc: EdgeRAGError) -> Response:
    return error(status_of(exc), str(exc))


async def _client_left(request: Request, exc: ClientDisconnect) -> Response:
    """The client closed the connection before its whole body came in: nothing failed here, and no one reads this
    (left to the catch-all, it was a 48-line traceback at ERROR in the server's log per cut request)."""
    return error(400, "the client left before sending its whole request")


async def _unexpected(request: Request, exc: Exception) -> Response:
    return error(500, f"internal error: {type(exc).__name__}")


# Each handler takes the exception type it is registered for (Starlette calls it only with that type).
HANDLERS: dict[type[Exception], Callable[..., Awaitable[Response]]] = {HTTPException: _http_error, InputError: _input_error, BudgetError: _budget_error,
            NotReady: _not_ready, OSError: _disk_full, EdgeRAGError: _server_error, ClientDisconnect: _client_left,
            Exception: _unexpected}
