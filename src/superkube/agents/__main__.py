"""`python -m superkube.agents [gpu-tests]`: the image reference the in-cluster layer pins, to tag a build with.

`python -m superkube.agents inputs --check|--write`: whether `data/image_inputs.txt` (the sha256s of
the pins and Dockerfiles the images are built from, part of the tag's digest) matches the checkout,
or write it so."""

import sys

from superkube.agents import AGENTS_IMAGE, CHECKOUT, GPU_TESTS_IMAGE, INPUTS_FILE, image_inputs


def inputs(mode: str) -> int:
    try:
        want = image_inputs()
    except OSError as e:
        print(f"error: {e.filename} cannot be read: run this from a checkout of superkube", file=sys.stderr)
        return 2
    if mode == "--write":
        INPUTS_FILE.write_text(want)
        return 0
    if INPUTS_FILE.read_text() != want:
        print(f"error: {INPUTS_FILE.relative_to(CHECKOUT)} is stale (an image's pins or Dockerfile changed): "
              "run `python -m superkube.agents inputs --write` and commit it", file=sys.stderr)  # fmt: skip
        return 1
    return 0


args = sys.argv[1:]
if args[:1] == ["inputs"]:
    if args[1:] not in (["--check"], ["--write"]):
        print("usage: python -m superkube.agents inputs --check|--write", file=sys.stderr)
        sys.exit(2)
    sys.exit(inputs(args[1]))
print(GPU_TESTS_IMAGE if args == ["gpu-tests"] else AGENTS_IMAGE)
