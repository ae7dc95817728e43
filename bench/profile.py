"""Profile one variant: ``python -m bench.profile "1 send/tx" "alkstore sync"``.

Runs the variant once under :mod:`cProfile` (main thread only; for the threaded
worker scenarios use ``py-spy record -o out.svg -- python -m bench --only ...``)
and prints the functions where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

from .common import DEFAULT_URL, Config, drop, install, new_schema
from .run import collect


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("scenario")
    p.add_argument("variant")
    p.add_argument("--database-url", default=os.environ.get("ALKSTORE_DATABASE_URL", DEFAULT_URL))
    p.add_argument("--full", action="store_true", help="full sizes instead of --quick sizes")
    p.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    p.add_argument("--limit", type=int, default=35)
    p.add_argument("--out", help="also dump the raw profile here (for snakeviz etc.)")
    p.add_argument(
        "--schema-version", type=int, choices=(26, 46), default=26, help="as for python -m bench"
    )
    args = p.parse_args()
    cfg = Config(
        url=args.database_url,
        schema=new_schema(),
        quick=not args.full,
        reps=1,
        schema_version=args.schema_version,
    )
    install(cfg)
    try:
        chosen = [
            v
            for v in collect(cfg, [args.scenario])
            if v.scenario == args.scenario and v.name == args.variant
        ]
        if not chosen:
            raise SystemExit(f"no variant {args.variant!r} in scenario {args.scenario!r}")
        prof = cProfile.Profile()
        prof.enable()
        samples = chosen[0].run(cfg)
        prof.disable()
    finally:
        drop(cfg)
        cfg.close()
    for s in samples:
        print(f"{s.scenario} / {s.variant}: {s.value:,.1f} {s.metric} (under the profiler)")
    if args.out:
        prof.dump_stats(args.out)
    pstats.Stats(prof).strip_dirs().sort_stats(args.sort).print_stats(args.limit)


if __name__ == "__main__":
    main()
