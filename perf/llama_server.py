"""llama.cpp's ``llama-server``, built once per machine from the source the ``engine`` extra pins.

The ``engine`` extra pins ``llama-cpp-python``; that package's sdist carries llama.cpp itself
under ``vendor/llama.cpp`` (``tools/server`` is the C++ OpenAI-compatible server, which batches
requests continuously over ``-np`` slots, unlike llama-cpp-python's Python server, which serves
one request at a time). This module downloads that sdist with pip (its sha256 checked against
:data:`SDIST_SHA256`), builds only the ``llama-server`` target with CMake for the CPU (no GPU
backend, no curl or OpenSSL, no web UI: nothing is fetched during the build) and keeps the
binary at::

    $XDG_CACHE_HOME/enginefit/llama-server/<sdist sha256>/<build key>/llama-server

(``~/.cache`` without ``XDG_CACHE_HOME``). The build key hashes the CMake flags, the compiler's
version and the CPU's instruction-set flags (the build is ``-march=native``), so a second
checkout on the same machine finds the binary and compiles nothing, and a home folder shared
with another kind of CPU never runs a binary built for this one. Concurrent builds (two
checkouts' ``make`` at once) wait on one lock; a build that fails or is killed leaves nothing
behind but its temporary folder, which the next build removes.

``python -m perf.llama_server [build | path]``: ``build`` (the default) builds when the cache
has no binary and prints its path; ``path`` prints the path of the cached binary, or exits 1
naming the command that builds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "llama-cpp-python"
#: sha256 of each pinned version's sdist on PyPI (a new pin needs its line here: pip refuses a
#: download whose hash differs, so a replaced or tampered file is never built).
SDIST_SHA256 = {
    "0.3.36": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
}
BINARY = "llama-server"
#: The CMake configuration: a self-contained CPU binary, the server target only.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one file to cache, no libllama.so beside it
    "-DGGML_NATIVE=ON",
    "-DGGML_CCACHE=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_HIP=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_SYCL=OFF",
    "-DGGML_OPENCL=OFF",
    "-DGGML_RPC=OFF",
    "-DLLAMA_CURL=OFF",  # no model downloads
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # the web UI would need npm,
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # or a download from Hugging Face
)


class BuildError(RuntimeError):
    """The server cannot be built here; the message says why and what to install."""


def pinned_version(pyproject: Path = REPO / "pyproject.toml") -> str:
    """The ``llama-cpp-python`` version the ``engine`` extra pins (``==X``)."""
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for requirement in extras.get("engine", []):
        match = re.fullmatch(rf"{re.escape(PACKAGE)}(?:\[[^\]]*\])?==([\w.]+)", requirement)
        if match:
            return match.group(1)
    raise BuildError(f"{pyproject}: the engine extra does not pin {PACKAGE}==<version>")


def sdist_sha256(version: str) -> str:
    try:
        return SDIST_SHA256[version]
    except KeyError:
        raise BuildError(
            f"{PACKAGE}=={version} is pinned but perf/llama_server.py has no sha256 for its "
            "sdist: add it to SDIST_SHA256 (pip download --no-binary :all: --no-deps "
            f"{PACKAGE}=={version}; sha256sum the file)"
        ) from None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "enginefit" / BINARY


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (what -march=native compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return cxx
    return f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else ''}"


def build_key() -> str:
    """What makes two builds of one sdist differ: flags, compiler, CPU."""
    text = json.dumps(
        {
            "flags": CMAKE_FLAGS,
            "compiler": _compiler(),
            "cpu": _cpu_flags(),
            "machine": platform.machine(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def binary_path(version: str | None = None) -> Path:
    """Where the pinned version's binary is (or will be) cached on this machine."""
    sha = sdist_sha256(version or pinned_version())
    return cache_root() / sha / build_key() / BINARY


def cached_binary() -> Path | None:
    """The cached binary of the pinned version, if this machine has built it."""
    try:
        path = binary_path()
    except BuildError:
        return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _run(cmd: list[str], cwd: Path, log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        code = subprocess.run(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise BuildError(f"{cmd[0]} {cmd[1]} exited with {code}; its log ends with:\n{tail}")


def _download(version: str, sha: str, folder: Path, log: Path) -> Path:
    requirement = folder / "requirement.txt"
    requirement.write_text(f"{PACKAGE}=={version} --hash=sha256:{sha}\n", encoding="utf-8")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--require-hashes",
            "-r",
            str(requirement),
            "-d",
            str(folder),
        ],
        folder,
        log,
    )
    found = sorted(folder.glob("*.tar.gz"))
    if len(found) != 1:
        raise BuildError(f"pip download left {len(found)} sdists in {folder}, expected one")
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != sha:  # pip checked it too; a second look costs a second
        raise BuildError(f"{found[0].name}: sha256 {digest}, expected {sha}")
    return found[0]


def _extract_llama_cpp(sdist: Path, folder: Path) -> Path:
    """Only ``vendor/llama.cpp`` of the sdist (tarfile's "data" filter: no links out, no
    device files, no absolute paths)."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in f"/{m.name}"]
        archive.extractall(folder, members=members, filter="data")
    sources = sorted(folder.glob("*/vendor/llama.cpp"))
    if not sources or not (sources[0] / "tools" / "server").is_dir():
        raise BuildError(f"{sdist.name} has no vendor/llama.cpp/tools/server")
    return sources[0]


def _require_tools() -> list[str]:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError(
            "cmake is not installed (needed to build llama-server; Debian/Ubuntu: apt-get "
            "install cmake g++)"
        )
    if shutil.which(os.environ.get("CXX") or "c++") is None and shutil.which("g++") is None:
        raise BuildError("no C++ compiler (c++ or g++; Debian/Ubuntu: apt-get install g++)")
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def build(*, say: bool = True) -> Path:
    """The cached binary of the pinned version, built first if this machine has none."""
    version = pinned_version()
    sha = sdist_sha256(version)
    target = binary_path(version)
    if target.is_file():
        return target
    generator = _require_tools()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".lock-{sha[:16]}").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout may be building it right now
        if target.is_file():
            return target
        for stale in root.glob(f"{sha}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a build killed before it finished
        work = Path(tempfile.mkdtemp(prefix=f"{sha}.building-", dir=root))
        log = work / "build.log"
        started = time.monotonic()
        if say:
            print(
                f"building {BINARY} from {PACKAGE}=={version}'s llama.cpp (once per machine; "
                f"log: {log})",
                file=sys.stderr,
            )
        try:
            sdist = _download(version, sha, work, log)
            downloaded = time.monotonic()
            source = _extract_llama_cpp(sdist, work / "src")
            build_dir = work / "build"
            _run(
                ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *CMAKE_FLAGS],
                work,
                log,
            )
            jobs = str(os.cpu_count() or 1)
            _run(
                ["cmake", "--build", str(build_dir), "--target", BINARY, "--parallel", jobs],
                work,
                log,
            )
            built = build_dir / "bin" / BINARY
            if not built.is_file():
                raise BuildError(f"the build finished without {built}")
            staged = work / "out"
            staged.mkdir()
            shutil.copy2(built, staged / BINARY)
            seconds = time.monotonic() - started
            (staged / "build-info.json").write_text(
                json.dumps(
                    {
                        "package": f"{PACKAGE}=={version}",
                        "sdist_sha256": sha,
                        "cmake_flags": list(CMAKE_FLAGS),
                        "compiler": _compiler(),
                        "download_s": round(downloaded - started, 1),
                        "build_s": round(seconds, 1),
                    },
                    indent=2,
                )
                + "\n",
                encoding="utf-8",
            )
            target.parent.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(target.parent, ignore_errors=True)  # a folder without its binary
            staged.rename(target.parent)  # atomic: the binary appears complete or not at all
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if say:
            print(f"built {target} in {seconds / 60:.1f} min", file=sys.stderr)
        return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "build"
    if command not in ("build", "path"):
        print(
            f"usage: python -m perf.llama_server [build | path] (got {command!r})", file=sys.stderr
        )
        return 2
    try:
        if command == "path":
            found = cached_binary()
            if found is None:
                print(
                    f"{BINARY} is not built on this machine: run `python -m perf.llama_server "
                    "build` (or `make engine`)",
                    file=sys.stderr,
                )
                return 1
            print(found)
            return 0
        print(build())
    except BuildError as exc:
        print(f"cannot build {BINARY}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
