"""llama.cpp built once from the vendored sources of the llama-cpp-python sdist on PyPI (no other download).

One CMake build gives both local pieces: `llama-server` (the C++ OpenAI server the local tiers run) and the
shared `libllama` that the `llama_cpp` Python binding loads (the binding is installed without its own build,
`CMAKE_ARGS=-DLLAMA_BUILD=OFF`, and `link_binding` points its `lib/` at this build). Cached under
$GATEWAY_LLAMA_DIR, else ~/.cache/gateway/llama.cpp/<version>-<flags digest>/: `make run` and `make test` call
`python -m gateway.local.llama_build`, which returns at once when the build is there.

The build fetches nothing: no web UI (neither npm nor the Hugging Face bucket), no TLS library, no tests,
examples or extra tools; only the `llama-server` target and what it links (llama, ggml, common, mtmd).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist; the `local` extra pins the same version
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",  # libllama.so for the Python binding, beside the server
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # tools/server lives under tools/; only its target is built
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # no npm build of the web UI
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # and no download of a prebuilt one
    "-DLLAMA_OPENSSL=OFF",  # loopback HTTP only
    "-DGGML_CCACHE=OFF",
)
TARGETS = ("llama-server",)
SERVER = "llama-server"
LIBRARIES = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so", "libmtmd.so")
_DONE = ".complete"


def build_root() -> Path:
    """Where this version and these flags are built: $GATEWAY_LLAMA_DIR, else under ~/.cache/gateway."""
    override = os.environ.get("GATEWAY_LLAMA_DIR")
    if override:
        return Path(override)
    digest = hashlib.sha256("\n".join((VERSION, *CMAKE_FLAGS, *TARGETS)).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "gateway" / "llama.cpp" / f"{VERSION}-{digest}"


def bin_dir() -> Path:
    return build_root() / "build" / "bin"


def server_binary() -> Path:
    """The built `llama-server`; a clear error naming the command that builds it when it is missing."""
    path = bin_dir() / SERVER
    if not (build_root() / _DONE).exists() or not path.exists():
        raise FileNotFoundError(
            f"llama-server is not built ({path} missing): run `make run` once, "
            f"or `{sys.executable} -m gateway.local.llama_build`")
    return path


def ensure_built(jobs: int | None = None) -> Path:
    """Build llama.cpp unless this version and these flags already are; returns the bin directory."""
    root = build_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `make` runs at once: the second waits, then finds it built
        if not (root / _DONE).exists():
            _build(root, jobs or os.cpu_count() or 1)
            (root / _DONE).write_text(f"{VERSION}\n" + "\n".join(CMAKE_FLAGS) + "\n")
    return bin_dir()


def _build(root: Path, jobs: int) -> None:
    started = time.monotonic()
    source = _vendored_source(root)
    fetched = time.monotonic()
    build = root / "build"
    cmake = _cmake()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run([cmake, "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS])
    _run([cmake, "--build", str(build), "--target", *TARGETS, "-j", str(jobs)])
    done = time.monotonic()
    print(f"llama.cpp {VERSION}: sdist {fetched - started:.0f} s, build {done - fetched:.0f} s -> {build / 'bin'}",
          file=sys.stderr)


def _cmake() -> str:
    """The system's cmake, else the `cmake` package from PyPI in this environment (as scikit-build-core
    did for llama-cpp-python's own build)."""
    found = shutil.which("cmake")
    if found:
        return found
    _run([sys.executable, "-m", "pip", "install", "-q", "cmake"])
    return str(Path(sys.executable).parent / "cmake")


def _vendored_source(root: Path) -> Path:
    """`vendor/llama.cpp` of the llama-cpp-python sdist, fetched from PyPI with pip (its cache applies)."""
    source = root / "src"
    if (source / "CMakeLists.txt").exists():
        return source
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        _run([sys.executable, "-m", "pip", "download", "-q", f"llama-cpp-python=={VERSION}",
              "--no-binary", ":all:", "--no-deps", "-d", tmp])
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name.removeprefix(prefix)
            archive.extractall(Path(tmp) / "src", members=[m for m in members if m.name], filter="data")
        (Path(tmp) / "src").rename(source)
    return source


def _run(command: list[str]) -> None:
    print("+ " + " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True, stdout=sys.stderr)


def binding_lib_dir() -> Path | None:
    """The installed `llama_cpp` binding's lib/ folder (where it loads libllama from), None without it."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def link_binding(lib: Path) -> list[str]:
    """Point `lib` (the binding's) at this build's shared libraries, one symlink each (one build, not two);
    returns the names linked."""
    lib.mkdir(exist_ok=True)
    linked = []
    for name in LIBRARIES:
        target, link = bin_dir() / name, lib / name
        if not target.exists():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        linked.append(name)
    return linked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.local.llama_build", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    args = parser.parse_args(argv)
    print(ensure_built(args.jobs))
    lib = binding_lib_dir()
    if lib is not None:
        print(f"llama_cpp binding: {', '.join(link_binding(lib))} in {lib} -> {bin_dir()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
