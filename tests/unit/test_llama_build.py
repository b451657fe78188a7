"""The llama.cpp build's cache: keyed by version and flags, a clear error when missing, the binding linked."""

from pathlib import Path

import pytest

from gateway.local import llama_build


def test_the_cache_key_names_the_version_and_changes_with_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_LLAMA_DIR", raising=False)
    root = llama_build.build_root()
    assert root.parent == Path.home() / ".cache" / "gateway" / "llama.cpp" and root.name.startswith("0.3.36-")
    monkeypatch.setattr(llama_build, "CMAKE_FLAGS", (*llama_build.CMAKE_FLAGS, "-DGGML_NATIVE=OFF"))
    assert llama_build.build_root() != root


def test_the_build_fetches_nothing_beyond_the_sdist() -> None:
    flags = set(llama_build.CMAKE_FLAGS)
    assert {"-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"} <= flags
    assert llama_build.TARGETS == ("llama-server",)


def test_a_missing_server_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LLAMA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make run.*gateway.local.llama_build"):
        llama_build.server_binary()
    (tmp_path / "build" / "bin").mkdir(parents=True)
    (tmp_path / "build" / "bin" / "llama-server").write_bytes(b"")
    with pytest.raises(FileNotFoundError):  # a build that did not finish is not a build
        llama_build.server_binary()
    (tmp_path / ".complete").write_text("")
    assert llama_build.server_binary() == tmp_path / "build" / "bin" / "llama-server"


def test_the_binding_loads_this_builds_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LLAMA_DIR", str(tmp_path / "llama"))
    built = tmp_path / "llama" / "build" / "bin"
    built.mkdir(parents=True)
    for name in ("libllama.so", "libggml.so"):
        (built / name).write_bytes(b"built")
    lib = tmp_path / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "libllama.so").write_bytes(b"from the wheel")
    assert llama_build.link_binding(lib) == ["libllama.so", "libggml.so"]
    assert (lib / "libllama.so").resolve() == built / "libllama.so" and (lib / "libggml.so").read_bytes() == b"built"


def test_the_build_and_the_binding_are_the_same_version() -> None:
    """The `local` extra pins the binding; the build takes llama.cpp from that same sdist (its libllama is
    what the binding loads, so the two must match)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    [pin] = [d for d in pyproject["project"]["optional-dependencies"]["local"] if d.startswith("llama-cpp-python")]
    assert pin.endswith(f"=={llama_build.VERSION}")
