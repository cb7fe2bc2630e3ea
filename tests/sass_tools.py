"""SASS disassembly for compile-only tests: nvdisasm / cuobjdump from the pip packages
nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump (the `test` extra), or from PATH."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from typing import Optional


@functools.cache
def _tool(name: str) -> Optional[str]:
    """Path of `name` inside an installed nvidia-* wheel (nvidia/*/bin), else on PATH."""
    try:
        import nvidia
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        for sub in sorted(os.listdir(root)):
            path = os.path.join(root, sub, "bin", name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return shutil.which(name)


def have_disassembler() -> bool:
    return _tool("nvdisasm") is not None or _tool("cuobjdump") is not None


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (nvdisasm, else cuobjdump -sass)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        nvdisasm = _tool("nvdisasm")
        cmd = [nvdisasm, path] if nvdisasm else [_tool("cuobjdump"), "-sass", path]
        if cmd[0] is None:
            raise RuntimeError("neither nvdisasm nor cuobjdump is installed "
                               "(pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump)")
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
