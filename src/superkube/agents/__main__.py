"""`python -m superkube.agents [gpu-tests]`: the image reference the in-cluster layer pins, to tag a build with."""

import sys

from superkube.agents import AGENTS_IMAGE, GPU_TESTS_IMAGE

print(GPU_TESTS_IMAGE if sys.argv[1:] == ["gpu-tests"] else AGENTS_IMAGE)
