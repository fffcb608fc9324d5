"""Typed bodies of the API (msgspec Structs): what the OpenAPI schema describes and what the
handlers answer. Row types define the columns of a data answer, in every format."""

from service.api.errors import ErrorBody

__all__ = ["ErrorBody"]
