"""`python -m gateway.client`: see gateway.client.cli."""

import sys

from gateway.client.cli import main

sys.exit(main())
