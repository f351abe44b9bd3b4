"""The lab's trainer image: Debian's Open MPI, an SSH server and mpi4py, with a small allreduce
program (images/trainer/allreduce.py), for the MPI jobs the lab runs through the real MPI Operator.

A production training image is the users' own (CUDA, NCCL, their framework) from their registry; the
lab's nodes reach no registry and have no GPUs, so this one is what an MPI job needs and nothing
more, made here as every lab image is: a debootstrapped Debian 12 root with PACKAGES (cached like the
base image), with its documentation and apt's caches left out, as one layer of an OCI archive that
converge imports into each node's containerd under TRAINER_IMAGE, the name the lab's example job
(examples/jobs/allreduce-lab.yaml) pins.

What the MPI Operator (v2beta1, OpenMPI) asks of an image, and how this one answers:
  - workers run `/usr/sbin/sshd -De` as root, with the job's key mounted at /root/.ssh: host keys
    are made when the image is built, the privilege-separation directory /run/sshd exists, PAM is
    off (a container has no login session) and StrictModes off (the key arrives through a
    Secret volume, whose files the operator makes readable by the group);
  - the launcher's `mpirun` reaches them over SSH by the host names in its hostfile, which change
    address when a worker is made again: the client checks no host key;
  - Open MPI runs as root only when told to (OMPI_ALLOW_RUN_AS_ROOT), and its TCP transport keeps
    off the loopback between hosts (openmpi-mca-params.conf).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from superkube.harness import build
from superkube.lab import images
from superkube.lab.errors import LabError
from superkube.lab.rootfs import CACHE_DIR, SUITE, debootstrap
from superkube.lab.state import Progress

PACKAGES = ("openmpi-bin", "python3-mpi4py", "openssh-server", "openssh-client")
RECIPE = 1  # bump when the steps below change: the image is built again
TRAINER_IMAGE = f"superkube.local/lab-trainer:{SUITE}-{RECIPE}"
PROGRAM = "/opt/superkube/allreduce.py"
LEFT_OUT = (
    "dev/",
    "proc/",
    "sys/",
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/locale/",
    "usr/share/lintian/",
    "var/cache/apt/",
    "var/lib/apt/lists/",
    "var/log/",
)
ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "OMPI_ALLOW_RUN_AS_ROOT=1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    "PYTHONUNBUFFERED=1",
]
SSHD = "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
SSH = "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n"
MCA = "btl = tcp,self\npml = ob1\nbtl_tcp_if_exclude = lo\noob_tcp_if_exclude = lo\n"


def _finish(root: Path) -> None:
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/superkube-trainer.conf").write_text(SSHD)
    (root / "etc/ssh/ssh_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/ssh_config.d/superkube-trainer.conf").write_text(SSH)
    mca = root / "etc/openmpi/openmpi-mca-params.conf"
    mca.write_text(mca.read_text() + "\n# superkube's lab trainer\n" + MCA if mca.is_file() else MCA)
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    if not list((root / "etc/ssh").glob("ssh_host_*_key")):
        raise LabError(f"{root}: openssh-server made no host keys; remove the folder and build it again")


def root(progress: Progress, cache_dir: Path = CACHE_DIR) -> Path:
    """The trainer's Debian root (debootstrapped once; cached)."""
    key = hashlib.sha256(json.dumps([SUITE, sorted(PACKAGES), RECIPE, SSHD, SSH, MCA]).encode()).hexdigest()
    return debootstrap(f"trainer-{SUITE}-{key[:12]}", PACKAGES, _finish, progress, cache_dir, "trainer root")


def _entries(tree: Path) -> dict[str, images.Entry]:
    """Every file, link and directory under `tree` but LEFT_OUT, as layer entries."""
    out: dict[str, images.Entry] = {}
    for folder, dirs, files in os.walk(tree):
        here = Path(folder)
        rel = here.relative_to(tree).as_posix()
        prefix = "" if rel == "." else rel + "/"
        for name in [*dirs, *files]:
            path = prefix + name
            on_disk = here / name
            if any(path.startswith(p) for p in LEFT_OUT):
                continue
            info = on_disk.lstat()
            if stat.S_ISLNK(info.st_mode):
                out["/" + path] = images.Link(os.readlink(on_disk))
            elif stat.S_ISDIR(info.st_mode):
                out["/" + path] = images.DIRECTORY
            elif stat.S_ISREG(info.st_mode):
                out["/" + path] = (on_disk.read_bytes(), info.st_mode & 0o7777)
        dirs[:] = [d for d in dirs if not any((prefix + d + "/").startswith(p) for p in LEFT_OUT)]
    for name in ("dev", "proc", "sys", "tmp", "run", "var/log"):
        out["/" + name] = images.DIRECTORY
    return out


def trainer(
    progress: Progress = lambda what, fraction: None,
    root_cache: Path = CACHE_DIR,
    image_cache: Path = build.CACHE_DIR,
) -> images.Image:
    """The trainer image's OCI archive (made once per root and program): its Debian root cached
    beside the lab's base image (`root_cache`), the archive beside the other images' (`image_cache`)."""
    from superkube.plan import engine as planning

    tree = root(progress, root_cache)
    program = (planning.find_project() / "images" / "trainer" / "allreduce.py").read_bytes()
    key = hashlib.sha256(str(tree).encode() + b"\0" + program).hexdigest()[:16]
    where = image_cache / "images" / "lab-trainer" / key
    facts = where / "image.json"
    if facts.is_file():
        known = json.loads(facts.read_text())
        if known.get("ref") == TRAINER_IMAGE and Path(known["path"]).is_file():
            return images.Image(
                "lab-trainer", TRAINER_IMAGE, Path(known["path"]), known["sha256"], known["digest"]
            )
    progress("the trainer image (one layer of its Debian root)", 0.9)
    files = _entries(tree)
    files[PROGRAM] = (program, 0o755)
    files["/opt/superkube"] = images.DIRECTORY
    files["/opt"] = images.DIRECTORY
    image = images.oci_archive(
        "lab-trainer", files, ["/usr/bin/python3", PROGRAM], where, ref=TRAINER_IMAGE, user="0:0", env=ENV
    )
    facts.write_text(json.dumps(image.as_fact(), sort_keys=True))
    return image
