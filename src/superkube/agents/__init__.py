"""Programs that run on nodes or in the cluster: exporters, the CNI config agent, the health agent.

The in-cluster ones run from one image, built from this checkout by `Dockerfile.agents`. Its tag is
the package's version and a digest of the package's contents (every module and data file the wheel
carries), which is the tag the in-cluster layer pins: a change to the agents' code or data is a new
tag, so it rolls out, and an unchanged checkout renders the same tag. What the images are built from
beyond the package (the dependency pins, the agents' requirements, both Dockerfiles) is in the digest
too, through `data/image_inputs.txt`: their sha256s, shipped with the package so an installed wheel
names the same tag as the checkout it came from. `python -m superkube.agents inputs --write`
refreshes that file after a pin changes; `inputs --check` (run by the tests) fails while it is stale. The GPU tests (preflight and
the periodic test, which run the active check on CUDA) run from a second image, `Dockerfile.gputests`:
the same package on a PyTorch CUDA base, several GB the other agents have no need of.

    docker build -f Dockerfile.agents -t "$(python -m superkube.agents)" .
"""

from __future__ import annotations

import hashlib
from importlib.metadata import version
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
SHIPPED = ("**/*.py", "data/*.yaml", "data/*.txt")  # what the wheel carries (pyproject's package-data)
CHECKOUT = PACKAGE.parents[1]
IMAGE_INPUTS = (
    "constraints.txt",
    "images/agents/requirements.txt",
    "Dockerfile.agents",
    "Dockerfile.gputests",
)
INPUTS_FILE = PACKAGE / "data" / "image_inputs.txt"


def content_digest(root: Path = PACKAGE) -> str:
    """sha256 of the package's shipped files, each by its path under `root` and its bytes."""
    h = hashlib.sha256()
    files = sorted({p for pattern in SHIPPED for p in root.glob(pattern) if "__pycache__" not in p.parts})
    for path in files:
        rel = path.relative_to(root).as_posix().encode()
        body = path.read_bytes()
        h.update(b"%d:%s%d:" % (len(rel), rel, len(body)))
        h.update(body)
    return h.hexdigest()


def image_inputs(checkout: Path = CHECKOUT) -> str:
    """What `data/image_inputs.txt` must say for `checkout`: a sha256 per image input, by path."""
    lines = [f"{hashlib.sha256((checkout / f).read_bytes()).hexdigest()}  {f}" for f in IMAGE_INPUTS]
    return (
        "# sha256 of what the images are built from beyond the package: python -m superkube.agents inputs --write\n"
        + "\n".join(lines)
        + "\n"
    )


def image_tag(root: Path = PACKAGE) -> str:
    return f"{version('superkube')}-{content_digest(root)[:12]}"


TAG = image_tag()
AGENTS_IMAGE = f"ghcr.io/superkube/agents:{TAG}"
GPU_TESTS_IMAGE = f"ghcr.io/superkube/gpu-tests:{TAG}"
