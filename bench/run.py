"""``python -m bench``: every scenario, alkstore_sa and ceiling interleaved, N repetitions."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

from . import peers, shapes, soak
from .common import (
    DEFAULT_URL,
    Config,
    Sample,
    drop,
    dumps,
    install,
    median,
    new_schema,
    percentile,
    spread,
)
from .scenarios import (
    Variant,
    drain,
    failing,
    http_api,
    latency,
    mixed,
    pgbouncer,
    scale,
    scale26,
    send,
)
from .scenarios import peers as peer_scenarios

SCENARIO_MODULES = {
    "send": send,
    "drain": drain,
    "fail": failing,
    "latency": latency,
    "pgbouncer": pgbouncer,
    "mixed": mixed,
    "http api": http_api,
}
# Run only when an --only names them: they load up to a million jobs.
OPT_IN_MODULES = {"scale": scale, "scale26": scale26}

RESULTS = Path(__file__).resolve().parent / "results"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--database-url",
        default=os.environ.get("ALKSTORE_DATABASE_URL", DEFAULT_URL),
        help="PostgreSQL URL (env ALKSTORE_DATABASE_URL; default %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, about 2 minutes")
    p.add_argument("--reps", type=int, default=3, help="repetitions (at least 3; default 3)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only scenarios whose name contains this text (repeatable)",
    )
    p.add_argument("--json", type=Path, help="where to write the JSON results")
    p.add_argument(
        "--mixed-rate",
        type=float,
        default=500.0,
        help="jobs/s offered by the senders of the mixed scenario (default %(default)s)",
    )
    p.add_argument(
        "--mixed-async",
        action="store_true",
        help="also run the mixed scenario with the AsyncWorker (3 more minutes)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="run the peer scenarios (pg-boss 12.38, PgQueuer) instead of the default ones; "
        "with --only, add them to the selected scenarios (only the peer scenarios an --only "
        "starting with 'peers:' names, if one does)",
    )
    p.add_argument(
        "--schema-version",
        type=int,
        choices=(26, 46),
        default=26,
        help="pg-boss schema version of our bench schema (default %(default)s; pg-boss "
        "12.38 always runs at 46)",
    )
    p.add_argument(
        "--scale-max",
        type=int,
        default=1_000_000,
        help="largest ready backlog of the opt-in scale scenario (default %(default)s)",
    )
    p.add_argument("--keep-schema", action="store_true", help="do not drop the bench schema")
    soak.add_arguments(p)
    return p.parse_args(argv)


def collect(cfg: Config, only: list[str], with_peers: bool = False) -> list[Variant]:
    """The selected variants: ``--peers`` alone runs only the peer scenarios."""
    out: list[Variant] = []
    own = [o for o in only if not o.startswith("peers:")]
    if not with_peers or own:
        for module in SCENARIO_MODULES.values():
            for v in module.variants(cfg):
                if not only or any(o in v.scenario for o in only):
                    out.append(v)
        for module in OPT_IN_MODULES.values():
            out += [v for v in module.variants(cfg) if any(o in v.scenario for o in own)]
    if with_peers:
        named = [o for o in only if o.startswith("peers:")]
        out += [
            v
            for v in peer_scenarios.variants(cfg)
            if not named or any(o in v.scenario for o in named)
        ]
    return out


def run_all(cfg: Config, variants: list[Variant]) -> list[Sample]:
    """Every variant, interleaved: per repetition, per scenario, per round, each variant once."""
    samples: list[Sample] = []
    by_scenario: dict[str, list[Variant]] = defaultdict(list)
    for v in variants:
        by_scenario[v.scenario].append(v)
    for rep in range(cfg.reps):
        for scenario, group in by_scenario.items():
            rounds = max(v.rounds for v in group)
            for r in range(rounds):
                index = rep * rounds + r
                # Alternate the order so neither side always runs on a warmer cache.
                ordered = group if index % 2 == 0 else list(reversed(group))
                for v in ordered:
                    t0 = time.perf_counter()
                    got = v.run(cfg)
                    for s in got:
                        s.round = index
                    samples.extend(got)
                    shown = ", ".join(f"{s.value:,.1f} {s.metric}" for s in got[:2])
                    print(
                        f"[rep {rep + 1}/{cfg.reps} round {r + 1}/{rounds}] {scenario:<22} "
                        f"{v.name:<26} {shown}  ({time.perf_counter() - t0:.1f}s)",
                        flush=True,
                    )
    return samples


def summarise(variants: list[Variant], samples: list[Sample]) -> list[dict[str, Any]]:
    """Median, spread and ratio to the ceiling of every (scenario, variant, metric).

    The ratio is the median of the per-round ratios (each round runs both sides
    back to back), which cancels most of the drift of a shared machine; its
    interquartile range is reported alongside.
    """
    values: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for s in samples:
        values[(s.scenario, s.variant, s.metric)][s.round] = s.value
    by_name = {(v.scenario, v.name): v for v in variants}
    rows: list[dict[str, Any]] = []
    for (scenario, variant, metric), by_round in values.items():
        vals = list(by_round.values())
        v = by_name.get((scenario, variant))
        row: dict[str, Any] = {
            "scenario": scenario,
            "variant": variant,
            "metric": metric,
            "median": median(vals),
            "spread_pct": spread(vals),
            "values": vals,
            "compared_with": v.ceiling if v else None,
            "note": v.note if v else "",
        }
        base = values.get((scenario, v.ceiling, metric)) if v and v.ceiling else None
        if base:
            ratios = [by_round[i] / base[i] for i in by_round if base.get(i)]
            if ratios:
                row["ratio"] = median(ratios)
                row["ratio_iqr"] = [percentile(ratios, 25), percentile(ratios, 75)]
            if v and v.target and ratios and metric in v.target_metrics:
                op, goal = v.target
                row["target"] = f"{op} {goal:g}"
                row["met"] = row["ratio"] >= goal if op == ">=" else row["ratio"] <= goal
        rows.append(row)
    _against_best_peer(variants, values, rows)
    return rows


def _against_best_peer(
    variants: list[Variant],
    values: dict[tuple[str, str, str], dict[int, float]],
    rows: list[dict[str, Any]],
) -> None:
    """Add to each of our rows in a peer scenario its ratio to the best peer there.

    The best peer of a (scenario, metric) is the one with the best median (highest
    jobs/s, lowest latency); the ratio is the median of the per-round ratios, as
    for the ceiling.
    """
    kinds = {(v.scenario, v.name): v for v in variants}
    best: dict[tuple[str, str], tuple[str, float]] = {}
    for r in rows:
        v = kinds.get((r["scenario"], r["variant"]))
        if v is None or v.kind != "peer":
            continue
        key = (r["scenario"], r["metric"])
        lower = r["metric"].endswith("ms")
        if key not in best or (r["median"] < best[key][1] if lower else r["median"] > best[key][1]):
            best[key] = (r["variant"], r["median"])
    for r in rows:
        v = kinds.get((r["scenario"], r["variant"]))
        if v is None or v.kind != "ours" or (r["scenario"], r["metric"]) not in best:
            continue
        name = best[(r["scenario"], r["metric"])][0]
        base = values[(r["scenario"], name, r["metric"])]
        ours = values[(r["scenario"], r["variant"], r["metric"])]
        ratios = [ours[i] / base[i] for i in ours if base.get(i)]
        if not ratios:
            continue
        r["best_peer"] = name
        r["peer_ratio"] = median(ratios)
        r["peer_ratio_iqr"] = [percentile(ratios, 25), percentile(ratios, 75)]
        for metric, op, goal in v.peer_targets:
            if metric == r["metric"]:
                r["peer_target"] = f"{op} {goal:g}"
                r["peer_met"] = r["peer_ratio"] >= goal if op == ">=" else r["peer_ratio"] <= goal


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table (so the README can hold it as it is)."""
    head = ("scenario", "variant", "metric", "median", "spread", "vs", "ratio", "IQR", "target")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        ratio = r.get("ratio")
        target = r.get("target", "")
        if target:
            target += " ok" if r.get("met") else " MISSED"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["scenario"],
                    r["variant"],
                    r["metric"],
                    f"{r['median']:,.1f}",
                    f"{r['spread_pct']:.0f}%",
                    r["compared_with"] or "",
                    f"{ratio:.2f}" if isinstance(ratio, float) else "",
                    "{:.2f}-{:.2f}".format(*r["ratio_iqr"]) if "ratio_iqr" in r else "",
                    target,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def peer_table(rows: list[dict[str, Any]]) -> str:
    """The peer scenarios' rows: each against the ceiling, ours also against the best peer."""
    head = (
        *("scenario", "variant", "metric", "median", "spread", "vs ceiling", "IQR"),
        *("best peer", "vs best peer", "IQR", "target"),
    )
    # A row compared with another variant than the ceiling names it in the ratio's cell.
    ceilings = {r["scenario"] for r in rows if r["variant"] == "ceiling"}
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        if not r["scenario"].startswith("peers:"):
            continue
        ratio, pratio = r.get("ratio"), r.get("peer_ratio")
        target = r.get("peer_target", "")
        if target:
            target += " ok" if r.get("peer_met") else " MISSED"
        shown = f"{ratio:.2f}" if isinstance(ratio, float) else ""
        other = r.get("compared_with")
        if shown and other not in (None, "ceiling") and r["scenario"] in ceilings:
            shown += f" (vs {other})"
            if r.get("target"):
                mark = "ok" if r.get("met") else "MISSED"
                target = "; ".join(t for t in (target, f"vs {other} {r['target']} {mark}") if t)
        cells = [
            r["scenario"].removeprefix("peers: "),
            r["variant"],
            r["metric"],
            f"{r['median']:,.1f}",
            f"{r['spread_pct']:.0f}%",
            shown,
            "{:.2f}-{:.2f}".format(*r["ratio_iqr"]) if "ratio_iqr" in r else "",
            r.get("best_peer", ""),
            f"{pratio:.2f}" if isinstance(pratio, float) else "",
            "{:.2f}-{:.2f}".format(*r["peer_ratio_iqr"]) if "peer_ratio_iqr" in r else "",
            target,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "psycopg": psycopg.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reps < 3:
        print("--reps must be at least 3", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    cfg = Config(
        url=args.database_url,
        schema=new_schema(),
        quick=args.quick,
        reps=args.reps,
        mixed_rate=args.mixed_rate,
        mixed_async=args.mixed_async,
        schema_version=args.schema_version,
        scale_max=args.scale_max,
    )
    if args.soak:
        return _soak(cfg, args)
    started = time.perf_counter()
    install(cfg)
    try:
        with cfg.raw(autocommit=True) as conn:
            server = conn.execute("SHOW server_version").fetchone()
        # The ceiling is only a ceiling if the database does the same work on both sides.
        # Its statements are schema 26's: at 46 it is a reference, not our shape.
        if cfg.schema_version != 26:
            print("schema 46: the ceiling runs schema 26's statement shapes; no plan check")
        elif not shapes.compare(cfg, show_sql=False):
            print("warning: the ceiling's plans differ from alkstore_sa's", file=sys.stderr)
        variants = collect(cfg, args.only, args.peers)
        samples = run_all(cfg, variants)
    finally:
        peers.close_all(cfg, drop=not args.keep_schema)
        if not args.keep_schema:
            drop(cfg)
        cfg.close()
    rows = summarise(variants, samples)
    print()
    own = [r for r in rows if not r["scenario"].startswith("peers:")]
    if own:
        print(table(own))
    if len(own) < len(rows):
        print(("\n" if own else "") + peer_table(rows))
    elapsed = time.perf_counter() - started
    print(f"\n{len(samples)} samples in {elapsed:.0f}s, our schema at version {cfg.schema_version}")
    out = args.json or RESULTS / f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "when": dt.datetime.now(dt.UTC).isoformat(),
        "quick": cfg.quick,
        "reps": cfg.reps,
        "seconds": elapsed,
        "machine": {**machine(), "postgres": server[0] if server else None},
        "schema_version": cfg.schema_version,
        "summary": rows,
        "samples": [s.to_json() for s in samples],
    }
    out.write_text(dumps(doc))
    print(f"results written to {out}")
    return 0


def _soak(cfg: Config, args: argparse.Namespace) -> int:
    """``--soak``: install, run the memory soak, report, drop."""
    install(cfg)
    try:
        record = soak.run(cfg, args)
    finally:
        if not args.keep_schema:
            drop(cfg)
        cfg.close()
    record["schema_version"] = cfg.schema_version
    record["machine"] = machine()
    soak.report(record, args.json)
    return 0
