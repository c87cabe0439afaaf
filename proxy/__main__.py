"""`python -m proxy`: the caching proxy (`xsg proxy` runs this)."""
import sys

from proxy.cli import main

sys.exit(main())
