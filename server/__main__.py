import sys

from wattserve.server.cli import main

sys.exit(main())
