"""`edge-inferd` subcommands. The only module that exits, and where logging is set up.

Exit codes: 0 ok; 1 a gate failed or an unexpected error; 78 (EX_CONFIG) an invalid
config or model; 130 a forced stop (second SIGINT).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from daemon import __version__

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: systemd units can RestartPreventExitStatus=78
EXIT_INTERRUPTED = 130

logger = logging.getLogger("edge-inferd")


def _setup_logging(verbose: bool) -> None:
    # No timestamps of our own: journald stamps every line.
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-inferd", description="MQTT inference daemon for INT8 TFLite models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", required=True, type=Path)
    run.add_argument("--broker", help="HOST:PORT, overrides mqtt.broker")

    check = sub.add_parser("check-config", help="validate a config; exit 0 or 78")
    check.add_argument("--config", required=True, type=Path)
    check.add_argument("--deep", action="store_true",
                       help="also run each model once and every route's validate gate (what a reload checks)")

    val = sub.add_parser("validate", help="accuracy of a route's whole pipeline on labelled data")
    val.add_argument("--config", required=True, type=Path)
    val.add_argument("--route", required=True)
    val.add_argument("--data", required=True, type=Path, help=".npz with x (N, *input.shape) and y (N,)")
    val.add_argument("--float", dest="float_model", type=Path, help="float reference .tflite")
    val.add_argument("--max-drop", type=float, default=0.01, help="max accuracy drop vs --float (default 0.01)")
    val.add_argument("--min-accuracy", type=float, default=0.0, help="fail below this accuracy (default 0)")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bm = bench_sub.add_parser("model", help="per-invoke latency per backend, threads and batch")
    bm.add_argument("--config", required=True, type=Path)
    bm.add_argument("--route", required=True)
    bm.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    bm.add_argument("--threads", type=int, nargs="+", help="interpreter threads (default 1..cores)")
    bm.add_argument("--iterations", type=int, default=200)
    bm.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    _add_bench_e2e(bench_sub)

    status = sub.add_parser("status", help="a node's retained status and stats, as a table")
    status.add_argument("--broker", default="localhost:1883", help="HOST:PORT of the broker (default localhost:1883)")
    status.add_argument("--client-id", help="the node's mqtt.client_id (default: every node on the broker)")

    demo = sub.add_parser("demo", help="private broker + daemon + replay of the bundled test data")
    demo.add_argument("--config", type=Path, default=Path("config.yaml"))
    demo.add_argument("--limit", type=int, default=0, help="samples per route (default: all)")
    demo.add_argument("--quiet", action="store_true", help="print only the summary")
    return parser


def _add_bench_e2e(bench_sub: argparse._SubParsersAction) -> None:
    be = bench_sub.add_parser("e2e", help="echo floor, naive script and the daemon over one private mosquitto")
    be.add_argument("--config", type=Path, default=Path("config.yaml"), help="base config (default config.yaml)")
    be.add_argument("--requests", type=int, help="requests per burst (default 5000)")
    be.add_argument("--duration", type=float, help="seconds per open-loop rate (default 5; 2x for 2x capacity)")
    be.add_argument("--rates", nargs="+", help='open-loop rates: "1000" req/s or "0.5x" the daemon\'s drain rate')
    be.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    be.add_argument("--only", action="append", choices=("drain", "openloop", "cache", "batching"),
                    help="run only this phase (repeatable; openloop also runs drain, which sets its rates)")
    be.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder (default bench-out/)")


def _cmd_run(args: argparse.Namespace) -> int:
    from daemon.signals import ForcedExit, SignalQueue

    signals = SignalQueue.install()  # before anything slow: a signal during start-up is queued, not fatal
    from daemon.config import Config, load_config
    from daemon.service import Service

    def read(check_models: bool = True) -> Config:
        config = load_config(args.config, check_models)
        return config.with_broker(args.broker) if args.broker else config

    try:
        Service(read(), signals, reread=lambda: read(check_models=False)).run()
    except ForcedExit as exc:
        logger.warning("%s", exc)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from daemon.config import load_config

    config = load_config(args.config)
    if args.deep:
        from daemon.errors import ConfigError
        from daemon.evaluate import deep_check

        problems = deep_check(config)
        if problems:
            raise ConfigError(problems)
    print(f"{args.config}: valid ({len(config.models)} model(s), {len(config.routes)} route(s))"
          + (", every model runs and passes its gate" if args.deep else ""))
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from daemon.config import load_config
    from daemon.evaluate import validate

    config = load_config(args.config)
    report, ok = validate(config, args.route, args.data, args.float_model, args.max_drop, args.min_accuracy)
    print(json.dumps(report))
    return EXIT_OK if ok else EXIT_FAIL


def _cmd_bench(args: argparse.Namespace) -> int:
    return _cmd_bench_e2e(args) if args.bench_command == "e2e" else _cmd_bench_model(args)


def _cmd_bench_e2e(args: argparse.Namespace) -> int:
    from daemon.bench_e2e import Plan, run_bench
    from daemon.bench_report import summary, write_outputs

    plan = Plan.build(args.config, args.out, args.requests, args.duration, args.rates, args.quick, args.only)
    results = run_bench(plan)
    for path in write_outputs(results, args.out):
        print(f"wrote {path}", file=sys.stderr)
    print(summary(results))
    return EXIT_OK


def _cmd_bench_model(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from daemon.config import load_config
    from daemon.evaluate import bench_model, format_bench

    config = load_config(args.config)
    rows = bench_model(config, args.route, tuple(args.batch), args.threads, args.iterations,
                       progress=lambda msg: print(f"  timing {msg} ...", file=sys.stderr, flush=True))
    print(json.dumps([asdict(r) for r in rows]) if args.json else format_bench(rows))
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from daemon.node_status import fetch, render

    try:
        nodes = fetch(args.broker, args.client_id)
    except OSError as exc:
        print(f"error: cannot reach the broker at {args.broker}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if not nodes:
        print(f"no edge-inferd node {args.client_id or ''} on {args.broker}".replace("  ", " "), file=sys.stderr)
        return EXIT_FAIL
    print(render(nodes))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from daemon.demo import run_demo

    return EXIT_OK if run_demo(args.config, limit=args.limit, quiet=args.quiet) else EXIT_FAIL


_COMMANDS = {"run": _cmd_run, "check-config": _cmd_check, "validate": _cmd_validate, "bench": _cmd_bench,
             "status": _cmd_status, "demo": _cmd_demo}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from daemon.errors import ConfigError, DaemonError, ModelError

    args = _parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        code = _COMMANDS[args.command](args)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"{len(exc.errors)} config error(s)", file=sys.stderr)
        code = EXIT_CONFIG
    except ModelError as exc:
        print(f"model error: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    except DaemonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = EXIT_FAIL
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    sys.exit(code)
