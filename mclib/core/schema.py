"""What the YAML files' schemas are made of (pydantic): strict types, range checks with the
words of their message, and each validation error as one line naming the key and the value.

The profiles (`mclib.core.config`), the sweep files (`mclib.core.sweep`) and the jobqueue
files (`mclib.core.jobs`) each declare one schema of `Schema` models from these parts. A
value is never converted to another kind: "3" is not an integer, 1 is not true; an integer
is a number, a whole float (3.0) an integer. A bad value reads

    data.p_mask = 1.5 is outside [0, 1)
    unknown key model.hedas = 8 (known: kind, layers, heads, ...)
    settings[0].seeds = 'one' is not a list
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Strict, ValidationError
from pydantic_core import PydanticCustomError


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _listed(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


Int = Annotated[int, BeforeValidator(_whole), Strict()]
Float = Annotated[float, Strict()]  # strict still takes an int (1 -> 1.0), never a bool or a string
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


def check(test: Callable[[Any], bool], words: str) -> AfterValidator:
    """A range check: a value that fails `test` is "KEY = VALUE {words}"."""

    def run(value):
        if not test(value):
            raise PydanticCustomError("mclib", "{words}", {"words": words, "value": value})
        return value

    return AfterValidator(run)


POSITIVE = check(lambda v: v > 0, "must be positive")
NOT_NEGATIVE = check(lambda v: v >= 0, "must not be negative")
FRACTION = check(lambda v: 0 <= v < 1, "is outside [0, 1)")
FINITE_NOT_NEGATIVE = check(lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0")


def at_least_one(what: str) -> AfterValidator:
    return check(bool, f"must name at least one {what}")


def one_of(choices: tuple[str, ...]) -> AfterValidator:
    return check(lambda v: v in choices, f"is not one of {', '.join(choices)}")


def items(kind: Any) -> Any:
    """A list of `kind`; a single value is read as a list of one."""
    return Annotated[list[kind], BeforeValidator(_listed)]


class Schema(BaseModel):
    """A mapping of a YAML file: every key declared, none other accepted."""

    model_config = ConfigDict(extra="forbid")


_WORDS = {
    "int_type": "is not an integer",
    "float_type": "is not a number",
    "bool_type": "is not true or false",
    "string_type": "is not a string",
    "model_type": "is not a mapping",
    "dict_type": "is not a mapping",
    "list_type": "is not a list",
}


def dotted(loc: tuple) -> str:
    """("settings", 0, "name") -> "settings[0].name"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The Schema model that holds the key at `loc` (for an unknown key: the keys it knows)."""
    node: Any = root
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel):
            if isinstance(part, int) or part not in node.model_fields:
                return None
            node = node.model_fields[part].annotation
        while typing.get_origin(node) is not None:  # Annotated, list[...], X | None: the model inside
            args = [a for a in typing.get_args(node) if a is not type(None)]
            node = args[0] if args else None
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def problems(error: ValidationError, root: type[BaseModel], what: str) -> list[tuple[str, str]]:
    """(dotted key, one line naming it and its value) for each error, unknown keys first (a
    misspelt key is what a missing or defaulted one comes from). `what` names the whole
    file's value ("profile = [1, 2] is not a mapping")."""
    out, unknown = [], []
    for e in error.errors():
        key = dotted(e["loc"]) or what
        value = (e.get("ctx") or {}).get("value", e["input"])
        if e["type"] == "extra_forbidden":
            holder = _model_at(root, e["loc"][:-1])
            known = f" (known: {', '.join(holder.model_fields)})" if holder else ""
            unknown.append((key, f"unknown key {key} = {value!r}{known}"))
        elif e["type"] == "missing":
            out.append((key, f"{key} is missing"))
        else:
            words = e["ctx"]["words"] if e["type"] == "mclib" else _WORDS.get(e["type"], e["msg"])
            out.append((key, f"{key} = {value!r} {words}"))
    return unknown + out
