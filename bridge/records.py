"""Bases of the bridge's small value classes: `repr`, equality, hashing and immutability from their `__slots__`.

They stand where `@dataclass(slots=True)` would, because on Python 3.11 a
dataclass compiles each method it generates with `exec` when its module is
imported: the thirty records on the path of `agent-bridge run` cost more than
the rest of the bridge together. A record lists its fields in `__slots__`, in
order, and writes its own `__init__` (fields in that order, keywords work);
these bases add what a dataclass would, behaving as one does: `repr` as
`Name(field=value, ...)`, `==` between records of the same class compares the
fields in order, and `match` takes them positionally.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Record:
    """A mutable record; not hashable, as a dataclass with `eq` is not."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    """Every field in order, the base class's first (its `__slots__` and those of its bases)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = cls._fields + tuple(cls.__dict__.get("__slots__", ()))
        cls.__match_args__ = cls._fields

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __repr__(self) -> str:
        fields = ", ".join([f"{name}={getattr(self, name)!r}" for name in self._fields])
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class FrozenRecord(Record):
    """An immutable, hashable record: its `__init__` sets the fields with `_assign`."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def _assign(self, **fields: Any) -> None:
        """Set fields from `__init__`, past the `__setattr__` that refuses it to everyone else."""
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:
        return hash(self._values())

    # copy and pickle restore the fields through __setstate__, past the __setattr__ above.
    def __getstate__(self) -> list[Any]:
        return list(self._values())

    def __setstate__(self, state: list[Any]) -> None:
        for name, value in zip(self._fields, state, strict=True):
            object.__setattr__(self, name, value)


def fields(record: type[Record] | Record) -> tuple[str, ...]:
    """The names of a record's fields, in order (as `dataclasses.fields` gives a dataclass's)."""
    return record._fields
