"""The `multiseq` console script. It imports the command (numpy, rich, click, the engine: a
few hundred milliseconds) under a Ctrl-C guard, so that an early Ctrl-C ends the command with
one line and exit code 130, never a traceback."""

from __future__ import annotations

import sys

from multiseq.cli.interrupts import EXIT_INTERRUPTED  # signal and threading only: instant


def main() -> None:
    try:
        from multiseq.cli.main import cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    cli()
