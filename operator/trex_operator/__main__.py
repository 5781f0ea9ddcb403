"""`python -m trex_operator ...` is `trex operator ...`."""

from __future__ import annotations

import sys

from trex_operator.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
