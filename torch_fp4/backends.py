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
        # Plain dict lookups (no iteration over the enum class) so torch.compile traces this.
        if isinstance(value, Backend):
            return value
        found = None
        if isinstance(value, str):
            found = _BY_LABEL.get(value.lower().replace("_", "-"))
        elif isinstance(value, int) and not isinstance(value, bool):
            found = _BY_VALUE.get(value)
        if found is None:
            names = ", ".join(repr(label) for label in _BY_LABEL)
            raise ValueError(f"{arg}: expected one of {names}, got {value!r}")
        return found


_BY_LABEL = {b.label: b for b in Backend.__members__.values()}
_BY_VALUE = {int(b): b for b in Backend.__members__.values()}
