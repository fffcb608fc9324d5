"""Typed bodies of the API (msgspec Structs): what the OpenAPI schema describes and what the
handlers answer. Row types define the columns of a data answer, in every format.

They are the contract between the API and its clients (`service.client`, the worker's delivery
client), so they import nothing but msgspec: a client loads them without the web framework,
the database or the science."""

from service.schemas.errors import ErrorBody

__all__ = ["ErrorBody"]
