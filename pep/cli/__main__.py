"""`python -m pep.cli`: the `xsg` command."""
import sys

from pep.cli import main

sys.exit(main())
