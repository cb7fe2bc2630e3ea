"""Reading a .safetensors file for torch_fp4.checkpoint: its tensors as a lazy mapping, and a
missing, unreadable or corrupt file reported with its path and, where one is cut off, the tensor
(the safetensors library's own messages name neither)."""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping

import torch

from .ops import _checks as C


def safetensors_module():
    try:
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without the package
        raise ImportError("torch_fp4.checkpoint: reading and writing .safetensors files needs the "
                          "safetensors package (pip install safetensors)") from e
    return safetensors


class LazyFile(Mapping):
    """The tensors of an open safetensors file, each read on first access."""

    def __init__(self, handle, error: type):
        self._handle = handle
        self._error = error
        self._keys = list(handle.keys())
        self._key_set = set(self._keys)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._key_set:
            raise KeyError(key)
        try:
            return self._handle.get_tensor(key)
        except self._error as e:
            C.fail("load_safetensors", key, "tensor data the safetensors library can read",
                   f"{type(e).__name__}: {e}")

    def stored_dtype(self, key: str) -> str:
        """The safetensors dtype name of `key` ("F8_E4M3", ...), from the header alone."""
        return self._handle.get_slice(key).get_dtype()

    def __contains__(self, key) -> bool:
        return key in self._key_set

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


# safetensors refuses headers above 100 MB; reading one that large only to describe it is wasted.
_MAX_HEADER = 100_000_000


def _header_problem(header: bytes, data_start: int, size: int) -> str:
    """What the header of a file the library refused tells: that it is not JSON, or the first
    tensor whose data lies past the end of the file; "" when neither."""
    try:
        entries = json.loads(header)
    except ValueError:
        return "a header that is not valid JSON"
    try:
        ends = sorted((int(v["data_offsets"][1]), k) for k, v in entries.items()
                      if k != "__metadata__")
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return ""
    cut = [(end, key) for end, key in ends if data_start + end > size]
    if not cut:
        return ""
    end, key = cut[0]
    more = f", and {len(cut) - 1} more tensors after it" if len(cut) > 1 else ""
    return (f"a file cut short inside the data of tensor {key!r} (its data ends at byte "
            f"{data_start + end} of a {size}-byte file{more})")


def _corruption(path: str) -> str:
    """What is wrong with a file the safetensors library refused, told from its sizes and header
    (the library's own message names neither the file nor the tensor)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            readable = size >= 8 and 8 + length <= size and length <= _MAX_HEADER
            header = f.read(length) if readable else b""
    except OSError as e:
        return f"a file that cannot be read ({type(e).__name__}: {e})"
    if size < 8:
        return "an empty file" if size == 0 else f"a {size}-byte file (no 8-byte header length)"
    if 8 + length > size:
        return (f"a header length of {length} bytes with only {size - 8} bytes after it (a file "
                "cut short inside its header, or not a safetensors file)")
    found = _header_problem(header, 8 + length, size) if readable else ""
    return found or "a file the safetensors library rejects"


@contextlib.contextmanager
def open_file(op: str, path, device: str) -> Iterator[LazyFile]:
    """The file's tensors; a missing, unreadable or corrupt file raises naming it."""
    st = safetensors_module()
    name = str(path)
    try:
        handle = st.safe_open(name, framework="pt", device=str(device))
    except st.SafetensorError as e:
        raise ValueError(f"{op}: path: expected a valid .safetensors file, got {_corruption(name)} "
                         f"(file {name!r}; safetensors: {e})") from e
    except OSError as e:
        got = "no such file" if isinstance(e, FileNotFoundError) else f"{type(e).__name__}: {e}"
        raise type(e)(f"{op}: path: expected a readable .safetensors file, got {got} "
                      f"(file {name!r})") from e
    with handle:
        yield LazyFile(handle, st.SafetensorError)
