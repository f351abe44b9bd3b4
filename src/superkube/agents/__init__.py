"""Programs that run on nodes or in the cluster: exporters, the CNI config agent, the health agent.

The in-cluster ones run from one image, built from this checkout by `Dockerfile.agents` and tagged
with the package's version, which is the tag the in-cluster layer pins.
"""

from importlib.metadata import version

AGENTS_IMAGE = f"ghcr.io/superkube/agents:{version('superkube')}"
