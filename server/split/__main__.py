"""``python -m wattserve.server.split core|frontend``: one process of a split server (started
by ``server.split.supervisor``, not by hand)."""

import sys

from wattserve.server.split.processes import main

sys.exit(main(sys.argv[1:]))
