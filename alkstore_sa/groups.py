"""Group concurrency (schema 46): how many jobs of one group may run at once.

A job joins a group with the send options ``group_id`` (and ``group_tier``). A
worker or a fetch limits the active jobs of each group with ``group_concurrency``,
as pg-boss 12's ``groupConcurrency``: an integer, or a mapping
``{"default": n, "tiers": {"gold": m, ...}}`` whose ``tiers`` give the limit of the
groups of a tier, and ``default`` that of every other group (no tier, or a tier
the mapping does not name). See the "Limit concurrency per group" page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Required, TypedDict

from . import limits
from .errors import InvalidOptionsError, shown
from .options import INT32_MAX, check_text


class GroupConcurrencyConfig(TypedDict, total=False):
    """The mapping form of ``group_concurrency`` (pg-boss's ``GroupConcurrencyConfig``).

    ``default``: the limit of a group whose jobs have no tier, or a tier ``tiers``
    does not name. ``tiers``: the limit of the groups of each named tier.
    """

    default: Required[int]
    tiers: Mapping[str, int]


GroupConcurrency = int | GroupConcurrencyConfig
"""What ``group_concurrency`` accepts: one limit for every group, or per tier."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """A checked ``group_concurrency``: the default limit and each tier's."""

    default: int
    tiers: tuple[tuple[str, int], ...] = ()

    def limit(self, tier: str | None) -> int:
        """The limit of a group whose job has ``tier``."""
        return dict(self.tiers).get(tier, self.default) if tier is not None else self.default

    @property
    def most(self) -> int:
        """The largest limit of any tier."""
        return max([self.default, *(n for _, n in self.tiers)])

    @property
    def tiers_json(self) -> str:
        """The tiers as the JSON object the claim reads (``{}`` for none)."""
        return json.dumps(dict(self.tiers), separators=(",", ":"))


def _limit(option: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
        raise InvalidOptionsError(
            option, f"must be an integer from 1 to {INT32_MAX}, not {shown(value)}"
        )
    return value


def group_limits(value: object, option: str = "group_concurrency") -> GroupLimits:
    """``value`` checked as a ``group_concurrency`` (see the module); raises
    :class:`~alkstore_sa.InvalidOptionsError` naming ``option`` for anything else."""
    if isinstance(value, GroupLimits):
        return value
    if not isinstance(value, Mapping):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOptionsError(
                option,
                "must be an integer or a mapping {'default': n, 'tiers': {tier: n}}, "
                f"not {shown(value)}",
            )
        return GroupLimits(_limit(option, value))
    unknown = sorted(str(k) for k in set(value) - {"default", "tiers"})
    if unknown:
        raise InvalidOptionsError(
            option, f"unknown key {shown(unknown[0])} (a mapping takes 'default' and 'tiers')"
        )
    if "default" not in value:
        raise InvalidOptionsError(option, "a mapping needs 'default', the limit of other groups")
    default = _limit(f"{option}.default", value["default"])
    tiers = value.get("tiers")
    if tiers is None:
        return GroupLimits(default)
    if not isinstance(tiers, Mapping):
        raise InvalidOptionsError(
            f"{option}.tiers", f"must be a mapping of tier to limit, not {shown(tiers)}"
        )
    checked: list[tuple[str, int]] = []
    for tier, limit in tiers.items():
        check_text(
            f"{option}.tiers", tier, allow_empty=False, max_bytes=limits.MAX_GROUP_TIER_BYTES
        )
        checked.append((tier, _limit(f"{option}.tiers[{shown(tier)}]", limit)))
    return GroupLimits(default, tuple(sorted(checked)))
