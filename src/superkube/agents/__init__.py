"""Programs that run on nodes or in the cluster: exporters, the CNI config agent, the health agent.

The in-cluster ones run from one image, built from this checkout by `Dockerfile.agents` and tagged
with the package's version, which is the tag the in-cluster layer pins. The GPU tests (preflight and
the periodic test, which run the active check on CUDA) run from a second image, `Dockerfile.gputests`:
the same package on a PyTorch CUDA base, several GB the other agents have no need of.
"""

from importlib.metadata import version

AGENTS_IMAGE = f"ghcr.io/superkube/agents:{version('superkube')}"
GPU_TESTS_IMAGE = f"ghcr.io/superkube/gpu-tests:{version('superkube')}"
