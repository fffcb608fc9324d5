"""Lists of the API's answers (msgspec Structs) as DataFrames whose columns come from the schema:
one column per scalar or list field, typed from its annotation; fields that are Structs are
spread into their own fields when asked (`flatten`), other mappings left out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi
import polars as pl


def _dtype(info: mi.Type) -> pl.DataType | None:
    """The Polars type of a schema field, or None for one a column cannot hold."""
    if isinstance(info, mi.UnionType):
        kinds = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _dtype(kinds[0]) if len(kinds) == 1 else None
    if isinstance(info, mi.ListType):
        inner = _dtype(info.item_type)
        return None if inner is None else pl.List(inner)
    simple: dict[type[mi.Type], pl.DataType] = {
        mi.IntType: pl.Int64(),
        mi.FloatType: pl.Float64(),
        mi.StrType: pl.String(),
        mi.BoolType: pl.Boolean(),
        mi.DateTimeType: pl.Datetime("us", "UTC"),
    }
    return simple.get(type(info))


def _columns(
    schema: type[msgspec.Struct], flatten: Sequence[str]
) -> list[tuple[tuple[str, ...], str, pl.DataType]]:
    """(attribute path, column name, type) of each column, in the schema's field order."""
    info = mi.type_info(schema)
    if not isinstance(info, mi.StructType):
        raise TypeError(f"{schema!r} is not a msgspec Struct")
    out: list[tuple[tuple[str, ...], str, pl.DataType]] = []
    for field in info.fields:
        kind = field.type
        if field.name in flatten and isinstance(kind, mi.StructType):
            out += [
                ((field.name, inner.name), inner.name, dtype)
                for inner in kind.fields
                if (dtype := _dtype(inner.type)) is not None
            ]
        elif (dtype := _dtype(kind)) is not None:
            out.append(((field.name,), field.name, dtype))
    return out


def frame_of(
    items: Sequence[msgspec.Struct], schema: type[msgspec.Struct], *, flatten: Sequence[str] = ()
) -> pl.DataFrame:
    """`items` (each a `schema`) as one row each."""
    columns = _columns(schema, flatten)
    data: dict[str, list[Any]] = {name: [] for _, name, _ in columns}
    for item in items:
        for path, name, _ in columns:
            value: Any = item
            for attribute in path:
                value = getattr(value, attribute)
            data[name].append(value)
    return pl.DataFrame(data, schema={name: dtype for _, name, dtype in columns})
