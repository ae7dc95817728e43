"""The pg-boss schema versions this release knows and speaks.

A module at the bottom of the package, importing nothing of it: :mod:`alkstore_sa.errors`
words its advice with these numbers and :mod:`alkstore_sa.names` hands them on
(``alkstore_sa.names.SCHEMA_VERSION`` and the others are where the package reads them).
"""

from __future__ import annotations

SCHEMA_VERSION = 26
"""The oldest pg-boss schema version the runtime speaks (Node pg-boss 11.1.x to 12.5.x),
which the first of our migrations installs. ``alkstore db upgrade`` and
:func:`alkstore_sa.migrate.upgrade` go on to :data:`alkstore_sa.migrate.DEFAULT_SCHEMA_VERSION`
(46) unless told otherwise; the versions spoken are :data:`SPOKEN_SCHEMA_VERSIONS`."""

NO_VERSION_ROW = -1
"""What every reader of a schema's version row answers when ``<schema>.version``
exists but holds no row (a schema half built, or emptied by hand); ``None`` is the
answer when there is no version table at all (nothing installed)."""

SPOKEN_SCHEMA_VERSIONS: frozenset[int] = frozenset({SCHEMA_VERSION, 46})
"""The pg-boss schema versions the services, workers and supervisors accept.

26 (Node pg-boss 11.1.x, 12.0-12.5.x) and 46 (12.38.0), each with its own statements;
the runtime at 46 passes the interop suite against Node pg-boss 12.38.0
(the "Compatibility with pg-boss, and deliberate differences" page). Versions 27 to 45 are
never spoken: they are refused with advice to move on to 46. Read at every schema check (not
bound at import), so a test may narrow it with ``monkeypatch``."""

NEWEST_KNOWN_SCHEMA_VERSION = max(SPOKEN_SCHEMA_VERSIONS)
"""The newest pg-boss schema version this release knows and speaks (pg-boss 12.38.0's),
and the one our migrations install by default; a schema beyond it was migrated by a
newer pg-boss and is refused with advice to upgrade alkstore_sa. Follows the spoken
versions: speaking a new one is adding it there."""
