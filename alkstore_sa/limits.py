"""Limits on what a job may carry, checked before any SQL is sent.

Each limit keeps a row readable and claimable by every worker: a value past one of them
is refused with :class:`~alkstore_sa.errors.InvalidOptionsError` when it is sent, and a
row written past one by another client is failed on its own when it is claimed (see
docs/concepts/guarantees.md).
"""

from __future__ import annotations

#: Deepest nesting of arrays and objects accepted in job data and output. Python's JSON
#: decoder recurses once per level; 256 leaves a worker thread ample stack under the
#: default recursion limit of 1,000 frames.
MAX_JSON_DEPTH = 256
