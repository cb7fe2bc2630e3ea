"""Backend names (layer 0). Schemas carry the integer value; the Python surface accepts names."""
from __future__ import annotations

import enum


class Backend(enum.IntEnum):
    AUTO = 0
    REFERENCE = 1
    TRITON = 2
    CUTE_DSL = 3
    CUDA = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, value: "Backend | str | int", arg: str = "backend") -> "Backend":
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for b in cls:
                if b.label == value.lower().replace("_", "-"):
                    return b
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(repr(b.label) for b in cls)
        raise ValueError(f"{arg}: expected one of {names}, got {value!r}")
