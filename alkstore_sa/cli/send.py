"""``alkstore send QUEUE --data JSON [options]``: enqueue one job."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import shown
from ._common import CommandError, emit, leaf, parse_json
from ._options import SEND, add_options, given_options
from ._service import in_transaction

NOT_SENT = 3
"""Exit code when the queue's policy or a throttle slot refused the job."""


def register(sub: Any) -> None:
    send = leaf(sub, "send", "enqueue one job")
    send.add_argument("queue")
    send.add_argument("--data", metavar="JSON", help="the job's data, as JSON (default null)")
    add_options(send, SEND)
    send.set_defaults(handler=_send)


def _send(args: argparse.Namespace) -> int:
    data = parse_json("--data", args.data)
    options = given_options(args, SEND)
    job_id = in_transaction(args, lambda q: q.send(args.queue, data, **options))
    if job_id is None:
        raise CommandError(
            f"job not sent: queue {shown(args.queue)} refused it "
            "(policy, throttle slot or id taken)",
            NOT_SENT,
        )
    emit(args, {"id": str(job_id)} if args.json else str(job_id))
    return 0
