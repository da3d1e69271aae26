"""`python -m gateway.client`: see gateway.client.cli."""

import sys

from gateway.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
