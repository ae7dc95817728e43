"""``python -m alkstore_sa``: the ``alkstore`` command line, for an environment whose scripts
folder is not on ``PATH``."""

from .cli import main

raise SystemExit(main())
