"""/admin: operations on the service itself (API key) — an online backup of the database.

Only the service may open the DuckDB file while it runs, so it makes the backup itself:
`strata db backup PATH` asks it here when a service holds the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import msgspec
from litestar import Controller, Response, post
from litestar.openapi.datastructures import ResponseSpec

from service.api.auth import SECURITY, require_write_key
from service.api.errors import ConflictHttpError, ErrorBody, UnprocessableHttpError, error_response
from service.api.respond import ApiContext, errors
from service.store.backup import BackupError, BackupExistsError, DiskFullError, backup


class BackupRequest(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=4096,
            description=(
                "absolute path, on the service's machine, of a new file, or of an existing folder "
                "(the backup is then strata-<UTC time>.duckdb inside it)"
            ),
        ),
    ]
    keep: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=100_000,
                description=("with a folder: keep only the newest KEEP backups there"),
            ),
        ]
        | None
    ) = None


class BackupDone(msgspec.Struct):
    path: str
    bytes: int
    seconds: float
    runs: int
    revision: str | None
    removed: list[str]


_INSUFFICIENT = {
    507: ResponseSpec(
        data_container=ErrorBody,
        generate_examples=False,
        description="no space left for the backup; nothing written",
    )
}


class AdminController(Controller):
    path = "/api/v1/admin"
    tags = ["admin"]  # noqa: RUF012

    @post(
        "/backup",
        guards=[require_write_key],
        security=SECURITY,
        status_code=201,
        responses={**errors(400, 401, 403, 409, 422), **_INSUFFICIENT},
    )
    async def backup(self, ctx: ApiContext, data: BackupRequest) -> Response[BackupDone]:
        """A consistent snapshot of the database, written by the service while it keeps serving
        (API key). Every run stored before it is in it whole; none is half in it (ingests wait
        for the copy). 409 if the file exists, 422 for a relative path or a missing folder, 507
        when the disk is full (nothing is left behind)."""
        path = Path(data.path)
        if not path.is_absolute():
            raise UnprocessableHttpError(
                "path must be absolute (it is a path on the service's machine)"
            )
        try:
            done = await anyio.to_thread.run_sync(lambda: backup(ctx.store, path, keep=data.keep))
        except BackupExistsError as exc:
            raise ConflictHttpError(str(exc)) from None
        except DiskFullError as exc:
            return error_response(507, str(exc))  # type: ignore[return-value]
        except BackupError as exc:
            raise UnprocessableHttpError(str(exc)) from None
        return Response(
            BackupDone(
                done.path,
                done.bytes,
                round(done.seconds, 3),
                done.runs,
                done.revision,
                list(done.removed),
            ),
            status_code=201,
        )
