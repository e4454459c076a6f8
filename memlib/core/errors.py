"""The one error type memlib raises for bad input (Chapter 1)."""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MemlibError", "check_choice", "check_positive"]


class MemlibError(ValueError):
    """Bad input to memlib: the message names the bad value and the valid choices.

    Introduced in Chapter 1. The CLI prints the message on one line and exits with status 2.
    """


def check_choice(name: str, value: object, choices: Iterable[object]) -> None:
    """Raise :class:`MemlibError` unless ``value`` is one of ``choices``.

    Args:
        name: what the value is (``"dtype"``, ``"precision"``...), used in the message.
        value: the value given.
        choices: the valid values, listed in the message.
    """
    options = list(choices)
    if value not in options:
        listed = ", ".join(str(c) for c in options)
        raise MemlibError(f"unknown {name} {value!r}; expected one of: {listed}")


def check_positive(name: str, value: object, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise :class:`MemlibError` if it is not a positive integer.

    Args:
        name: the argument's name, used in the message.
        value: the value given.
        allow_zero: accept 0 as well.

    Returns:
        The value as a Python int.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_float = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise MemlibError(f"{name} must be an integer, got {value!r}") from None
        if not as_float.is_integer():
            raise MemlibError(f"{name} must be an integer, got {value!r}")
        value = int(as_float)
    lowest = 0 if allow_zero else 1
    if value < lowest:
        bound = "≥ 0" if allow_zero else "≥ 1"
        raise MemlibError(f"{name} must be an integer {bound}, got {value}")
    return value
