"""``python -m wattserve ...``: the same commands as the ``wattserve`` console script."""

import sys

from wattserve.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
