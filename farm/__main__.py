"""`python -m farm ...` is the `farm` command."""

import sys

from farm.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
