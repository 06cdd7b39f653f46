"""`python -m tff_fedadamom` is the `tff-fedadamom` command."""

from tff_fedadamom.cli import entry

entry()
