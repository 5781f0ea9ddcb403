"""`python -m trex` is `trex`."""

import sys

from trex.cli import main

sys.exit(main())
