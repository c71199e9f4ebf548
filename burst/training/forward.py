"""An attribute of a façade that lives in one of its parts.

``Run`` keeps ``run.step``, ``run.micro_batch`` and the like where users and the
integrations read them, while the part with that job (``Progress``, the batch ``Layout``)
owns the value: one place holds each number, and the façade grows no property per field.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Forward(Generic[T]):
    """``owner.<name>`` reads (and, when the part allows, writes) ``owner.<part>.<name>``
    (``owner.<part>.<field>`` when the part calls it ``field``)."""

    def __init__(self, part: str, field: str = "") -> None:
        self.part = part
        self.name = field

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)
