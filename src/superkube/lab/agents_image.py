"""The agents' image for the lab: the project's wheel and the agents' own dependencies on Debian's
Python, as one OCI archive named as the in-cluster layer pins it (`superkube.agents.AGENTS_IMAGE`).

In production `Dockerfile.agents` builds this image and a registry serves it; the lab reaches no
registry, so the same contents arrive as a file that converge imports into each node's containerd.
What goes in:
  - Python: the files of Debian's python3.11 packages (interpreter and standard library) from the
    lab's base image, and every shared library they load, found by reading each ELF file's needed
    libraries (DT_NEEDED) and resolving them in that image, symbolic links kept as links;
  - the agents: the project's wheel, installed without its dependencies (Pulumi, the Azure provider
    and Ansible belong to the controller, not to a pod), then images/agents/requirements.txt at
    constraints.txt's pins, as binary wheels for CPython 3.11 on manylinux x86_64.
The image's name carries the package's content digest, so a change to the agents' code is a new name;
the archive is cached by everything it is made of.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from superkube.harness import build
from superkube.lab import images

PYTHON = "python3.11"  # Debian 12's, which the lab's base image carries (and Dockerfile.agents' base)
PYTHON_PACKAGES = (f"{PYTHON}-minimal", f"lib{PYTHON}-minimal", f"lib{PYTHON}-stdlib")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib", "/lib")
SITE = f"/usr/local/lib/{PYTHON}/dist-packages"  # on Debian's sys.path for every user
LEFT_OUT = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/lintian/", "/usr/share/binfmts/")
REQUIREMENTS = "images/agents/requirements.txt"
ENV = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/tmp",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",  # the image is read-only to its user: nothing to cache .pyc in
    "PYTHONUNBUFFERED=1",
]


class Tree:
    """Files taken from a root filesystem into a layer, each path resolved inside that root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, images.Entry] = {}

    def resolve(self, path: str, depth: int = 0) -> str:
        """`path` with every symbolic link on the way followed inside the root; the links are kept."""
        if depth > 40:
            raise build.BuildError(f"{path}: too many symbolic links in {self.root}")
        done = PurePosixPath("/")
        parts = PurePosixPath(path).parts[1:]
        for i, part in enumerate(parts):
            here = done / part
            on_disk = self.root / str(here).lstrip("/")
            if on_disk.is_symlink():
                target = os.readlink(on_disk)
                self.files[str(here)] = images.Link(target)
                base = PurePosixPath(target) if target.startswith("/") else done / target
                rest = PurePosixPath(*parts[i + 1 :]) if i + 1 < len(parts) else None
                joined = os.path.normpath(str(base / rest) if rest else str(base))
                return self.resolve(joined, depth + 1)
            done = here
        return str(done)

    def add(self, path: str) -> str:
        """Take `path` (a file, or a link to one) into the layer; its resolved path."""
        real = self.resolve(path)
        on_disk = self.root / real.lstrip("/")
        if not on_disk.is_file():
            raise build.BuildError(f"{path}: not a file in {self.root}")
        self.files[real] = (on_disk.read_bytes(), on_disk.stat().st_mode & 0o7777)
        return real

    def package(self, name: str) -> list[str]:
        """The regular files and links that Debian package `name` installed (its dpkg file list)."""
        info = self.root / "var/lib/dpkg/info"
        listing = next((p for p in (info / f"{name}:amd64.list", info / f"{name}.list") if p.is_file()), None)
        if listing is None:
            raise build.BuildError(f"{name} is not installed in {self.root}; rebuild the lab's base image")
        out = []
        for line in listing.read_text().splitlines():
            on_disk = self.root / line.lstrip("/")
            if line.startswith(LEFT_OUT) or not (on_disk.is_symlink() or on_disk.is_file()):
                continue  # a directory (made for what it holds), or documentation
            real = self.resolve(line)  # a link is kept whatever it points at; `real` is no link
            if (self.root / real.lstrip("/")).is_file():
                out.append(self.add(real))
        return out

    def libraries(self, paths: list[str]) -> None:
        """Every shared library the ELF files among `paths` (taken already) need, and theirs, with the
        loader, from the root."""
        todo = [p for p in paths if isinstance(self.files.get(p), tuple)]
        seen: set[str] = set()
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            entry = self.files[path]
            assert isinstance(entry, tuple)
            needed, interpreter = elf_needs(entry[0], path)
            if interpreter:
                todo.append(self.add(interpreter))
            for lib in needed:
                if "/" in lib:  # a name, never a path: it is looked up in the library directories
                    raise build.BuildError(f"{path} needs {lib}: a path, not a library name")
                found = next(
                    (f"{d}/{lib}" for d in LIBRARY_DIRS if os.path.lexists(self.root / d.lstrip("/") / lib)),
                    None,
                )
                if found is None:
                    raise build.BuildError(f"{path} needs {lib}, which {self.root} does not have")
                todo.append(self.add(found))

    def directories(self) -> None:
        """Each file's parent directories as entries of their own (and /tmp, which Python writes to)."""
        for path in list(self.files):
            for parent in PurePosixPath(path).parents:
                if str(parent) != "/" and str(parent) not in self.files:
                    self.files[str(parent)] = images.DIRECTORY
        self.files["/tmp"] = images.DIRECTORY


def elf_needs(data: bytes, name: str = "") -> tuple[list[str], str | None]:
    """The DT_NEEDED names and the program interpreter of a 64-bit little-endian ELF file (none for
    anything else: a script, a data file)."""
    if len(data) < 0x40 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return [], None
    try:
        return _elf_needs(data)
    except (struct.error, StopIteration, ValueError, UnicodeDecodeError) as e:
        raise build.BuildError(f"{name}: not an ELF file this build can read ({e!r})") from None


def _elf_needs(data: bytes) -> tuple[list[str], str | None]:
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []  # (virtual address, file offset, size in file)
    dynamic = interpreter = None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
        elif p_type == 3:  # PT_INTERP
            interpreter = data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    if dynamic is None:
        return [], interpreter
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + i) for i in range(0, dynamic[1], 16)]
    strtab = next(v for tag, v in entries if tag == 5)  # DT_STRTAB, a virtual address
    base = next(off + strtab - vaddr for vaddr, off, size in loads if vaddr <= strtab < vaddr + size)
    names = []
    for tag, value in entries:
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED: an offset into the string table
            end = data.index(b"\0", base + value)
            names.append(data[base + value : end].decode())
    return names, interpreter


def python_runtime(root: Path) -> Tree:
    """Debian's Python from `root`, with what it loads."""
    tree = Tree(root)
    paths = [p for name in PYTHON_PACKAGES for p in tree.package(name)]
    tree.libraries(paths)
    tree.files["/usr/bin/python3"] = images.Link(PYTHON)
    tree.files["/usr/local/bin/python"] = images.Link(f"/usr/bin/{PYTHON}")
    return tree


def _pip(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        raise build.BuildError(f"pip {args[0]}: {proc.stderr.strip()[-600:]}")


def site_packages(project: Path, into: Path) -> None:
    """The project's wheel (built from a copy: the checkout gets no build files) and the agents'
    dependencies, installed into `into` as the image's site-packages."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "project"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(project / name, copy / name)
        shutil.copytree(
            project / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", f"{tmp}/wheels", str(copy))
        (wheel,) = Path(tmp, "wheels").glob("superkube-*.whl")
        _pip("install", "--no-deps", "--no-compile", "--target", str(into), str(wheel))
    _drop_direct_url(into)
    _pip(
        "install", "--no-compile", "--target", str(into), "--only-binary=:all:",
        "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
        "--abi", "cp311", "-c", str(project / "constraints.txt"), "-r", str(project / REQUIREMENTS),
    )  # fmt: skip
    _drop_scripts(into)


def _drop_scripts(site: Path) -> None:
    """Console scripts go (the pods run `python -m ...`), and so do their lines in each RECORD: pip
    writes the building Python's path into a script's first line, so its hash there differs from one
    checkout's virtual environment to another's."""
    shutil.rmtree(site / "bin", ignore_errors=True)
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith("../../bin/")))


def _drop_direct_url(site: Path) -> None:
    """pip records a wheel installed from a file by its path (direct_url.json, listed in RECORD): a
    temporary directory's name, which would make every build's layer differ. Both go."""
    for dist in site.glob("superkube-*.dist-info"):
        (dist / "direct_url.json").unlink(missing_ok=True)
        record = dist / "RECORD"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text(
            "".join(line for line in lines if not line.startswith(f"{dist.name}/direct_url.json,"))
        )


def agents(base_root: Path, cache_dir: Path = build.CACHE_DIR) -> images.Image:
    """The agents' image, named as the in-cluster layer pins it; built once per change to what it is
    made of (the base image, the package, its requirements and pins)."""
    from superkube.agents import AGENTS_IMAGE, content_digest
    from superkube.plan import engine as planning

    project = planning.find_project()
    key = hashlib.sha256(
        json.dumps(
            [
                str(base_root),
                AGENTS_IMAGE,
                content_digest(),
                *((project / f).read_text() for f in ("pyproject.toml", "constraints.txt", REQUIREMENTS)),
            ]
        ).encode()
    ).hexdigest()[:16]
    where = cache_dir / "images" / "agents" / key
    done = where / "image.json"
    if done.is_file():
        fact = json.loads(done.read_text())
        archive = Path(fact["path"])
        if archive.is_file():
            done.touch()  # the most recently used are the ones kept
            return images.Image("agents", fact["ref"], archive, fact["sha256"], fact["digest"])
    tree = python_runtime(base_root)
    files = tree.files
    with tempfile.TemporaryDirectory() as tmp:
        site_packages(project, Path(tmp))
        for path in sorted(Path(tmp).rglob("*")):
            inside = f"{SITE}/{path.relative_to(tmp).as_posix()}"
            if path.is_symlink():
                files[inside] = images.Link(os.readlink(path))
            elif path.is_dir():
                files[inside] = images.DIRECTORY
            elif "__pycache__" not in path.parts:
                files[inside] = (path.read_bytes(), 0o755 if os.access(path, os.X_OK) else 0o644)
    tree.libraries([p for p in files if p.startswith(SITE) and ".so" in PurePosixPath(p).name])
    tree.directories()  # (pydantic-core's extension needs libgcc_s, which Python itself does not)
    image = images.oci_archive(
        "agents", tree.files, ["/usr/local/bin/python"], where, ref=AGENTS_IMAGE, user="65532:65532", env=ENV
    )
    done.write_text(json.dumps(image.as_fact()))
    _prune(where.parent, keep=KEEP_BUILDS)
    return image


KEEP_BUILDS = 3  # every edit of the package is a new image: the last few stay, for labs still up


def _prune(builds: Path, keep: int) -> None:
    """Remove all but the `keep` most recently built or used images under `builds`."""
    done = sorted(builds.glob("*/image.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in done[keep:]:
        shutil.rmtree(old.parent, ignore_errors=True)
