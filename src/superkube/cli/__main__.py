"""`python -m superkube.cli`: the same command line as `superkube`."""

from superkube.cli import main

main()
