"""`python -m shardherd ...` runs the `shardherd` command line."""

import sys

from shardherd.services.cli import main

sys.exit(main())
