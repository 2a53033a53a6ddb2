"""`python -m robo_rl.cli ...` = `robo-rl ...`."""

import sys

from robo_rl.cli import main

sys.exit(main())
