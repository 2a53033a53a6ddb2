"""`robo-rl train | eval | compare | curves | demos | deploy | steer | checkpoint | info | bench | vla`:
the command-line front door; one module per job, the parser in ``parser.py``.

Every user error (config, checkpoint, CLI argument) ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys

from robo_rl.cli.parser import build_parser
from robo_rl.cli.train import cmd_train
from robo_rl.errors import RoboRLError

__all__ = ["build_parser", "main"]


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(show_path=False)])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("matplotlib", "PIL", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # dotted overrides may also follow options ("train CFG --resume X a.b=1"): argparse fills a
    # positional list only once, so later KEY=VALUE words come back unparsed
    stray = [w for w in extra if w.startswith("-") or "=" not in w]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    _setup_logging(args.verbose)
    try:
        code = int(args.fn(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not in the interpreter's exit flush
        return code
    except RoboRLError as err:
        print(f"robo-rl: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`robo-rl compare ... | head -1`): stop without a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not fail again
        return 141
    except KeyboardInterrupt:
        hint = "; resume with 'robo-rl train --resume RUN_DIR'" if getattr(args, "fn", None) is cmd_train else ""
        print(f"robo-rl: interrupted{hint}", file=sys.stderr)
        return 130
