"""`python -m babelprobe ...` (also what `torchrun -m babelprobe extract ...` runs)."""

import sys

from babelprobe.cli import main

sys.exit(main())
