"""`python -m tff_fedadamom` is the `tff-fedadamom` command."""

import sys

from tff_fedadamom.cli import main

sys.exit(main())
