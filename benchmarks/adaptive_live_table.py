"""The table of an ``adaptive_live_pair.sh`` sweep: per run and pooled over its rounds.

    python -m benchmarks.adaptive_live_table OUT [--slo-ms 100] [--percentile 99]

Why a pooled row: the p99 of one 10-second run at 45 req/s is its 5th-worst request out of
~400, so two runs of one configuration differ by tens of milliseconds; pooling the rounds'
requests (same server, same rate) gives the percentile on thousands. "meets" = the
percentile <= the objective and attainment >= the percentile (requests answered 200 within
the objective / requests sent in the measured windows: a 503 counts as a miss). Where the
run recorded the adaptive batcher's own series (the load generator's ``server.policy``),
the least hold a wait had during the run and the back-offs in it say whether the miss
back-off was acting. Prints markdown and writes OUT/table.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from support.live_sweep import markdown, table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--percentile", type=float, default=99.0)
    args = parser.parse_args()
    rows = table(args.out, args.slo_ms, args.percentile)
    print(markdown(rows, args.percentile))
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
