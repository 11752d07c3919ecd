"""`edge-inferd` subcommands (their options: cli_parser.py). The only module that exits, and where logging is set up.

Exit codes: 0 ok; 1 a gate failed or an unexpected error; 78 (EX_CONFIG) an invalid
config or model; 130 a forced stop (second SIGINT).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Callable, Mapping, Optional, Sequence

from daemon import cli_parser
from daemon.errors import EXIT_CONFIG
from daemon.lifecycle.heartbeat import INDEX_ENV  # set in a worker process's environment (daemon/lifecycle/supervisor.py)

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_INTERRUPTED = 130

logger = logging.getLogger("edge-inferd")


# Log lines carry their own timestamps except in the journal, which stamps every line itself.
_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
_STAMP_FORMAT = "%(asctime)s.%(msecs)03d "
_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
_STDERR_FD = 2


def stderr_is_journal(environ: Mapping[str, str] = os.environ, fd: int = _STDERR_FD) -> bool:
    """True when stderr is systemd's journal stream: $JOURNAL_STREAM is its `device:inode`
    (systemd.exec(5)), and a redirected stderr no longer matches it."""
    try:
        device, inode = (int(part) for part in environ.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(fd)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def log_format() -> str:
    return _LOG_FORMAT if stderr_is_journal() else _STAMP_FORMAT + _LOG_FORMAT


def log_level(args: argparse.Namespace) -> str:
    """--log-level when given, else debug with -v, else info."""
    return args.log_level or ("debug" if args.verbose else "info")


def _setup_logging(args: argparse.Namespace) -> None:
    index = os.environ.get(INDEX_ENV)  # a worker process names itself in each line: [w0], [w1], ...
    prefix = f"[w{index}] " if index is not None else ""
    logging.basicConfig(level=log_level(args).upper(), stream=sys.stderr, format=prefix + log_format(),
                        datefmt=_DATE_FORMAT)


def _missing_default_config(args: argparse.Namespace) -> Optional[str]:
    """The error when `--config` was not given and the default file does not exist, else None."""
    source = cli_parser.resolve_config(args)
    if not source or args.config.exists():
        return None
    env = f"${cli_parser.CONFIG_ENV}"
    return (f"error: no config file at {args.config} ({source}); choose one with --config PATH or "
            f"{'a different ' + env if env in source else env} (config.yaml in the source tree is an example)")


def _cmd_run(args: argparse.Namespace) -> int:
    from daemon.lifecycle.signals import ForcedExit, SignalQueue

    signals = SignalQueue.install()  # before anything slow: a signal during start-up is queued, not fatal
    from daemon.config.schema import Config
    from daemon.config.loader import load_config
    from daemon.lifecycle.service import Service

    def read(check_models: bool | Callable[[Config], bool] = True) -> Config:
        config = load_config(args.config, check_models)
        return config.with_broker(args.broker) if args.broker else config

    index = os.environ.get(INDEX_ENV)
    try:
        if index is not None:  # a worker process of a supervised node (daemon/lifecycle/supervisor.py)
            return _run_worker(int(index), read, signals)
        # With worker processes the children load (and check) the models, not the parent.
        config = read(check_models=lambda c: c.workers.processes == 1)
        if config.workers.processes > 1:
            from daemon.lifecycle.supervisor import Supervisor

            return Supervisor(config, [sys.executable, "-m", "daemon", *sys.argv[1:]], signals).run()
        Service(config, signals, reread=lambda: read(check_models=False)).run()
    except ForcedExit as exc:
        logger.warning("%s", exc)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _run_worker(index: int, read, signals) -> int:
    """One worker process: the whole daemon under its derived identity, beating into its heartbeat."""
    from pathlib import Path

    from daemon.lifecycle.heartbeat import HEARTBEAT_ENV, Heartbeat
    from daemon.lifecycle.service import Service
    from daemon.lifecycle.supervisor import child_config

    def derived(check_models: bool = True):
        return child_config(read(check_models), index)

    beat = Heartbeat(Path(os.environ[HEARTBEAT_ENV]), lambda: service.snapshot())
    service = Service(derived(), signals, reread=lambda: derived(check_models=False), notifier=beat)
    try:
        service.run()
    finally:
        beat.final()
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from daemon.config.loader import load_config

    config = load_config(args.config)
    if args.deep:
        from daemon.errors import ConfigError
        from daemon.pipeline.evaluate import deep_check

        problems = deep_check(config)
        if problems:
            raise ConfigError(problems)
    print(f"{args.config}: valid ({len(config.models)} model(s), {len(config.routes)} route(s))"
          + (", every model runs and passes its gate" if args.deep else ""))
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from daemon.config.loader import load_config
    from daemon.pipeline.evaluate import Gate, validate

    config = load_config(args.config)
    gate = Gate(args.min_accuracy, args.min_roc_auc, args.max_mae, args.fpr, args.max_drop)
    report, ok = validate(config, args.route, args.data, args.float_model, gate)
    print(json.dumps(report))
    return EXIT_OK if ok else EXIT_FAIL


def _cmd_inspect(args: argparse.Namespace) -> int:
    from daemon.model.inspection import report

    text, servable = report(args.model, args.runtime)
    print(text)
    return EXIT_OK if servable else EXIT_FAIL


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "soak":
        from daemon.tools.bench.soak import main as soak

        return soak(args)
    return _cmd_bench_e2e(args) if args.bench_command == "e2e" else _cmd_bench_model(args)


def _cmd_bench_e2e(args: argparse.Namespace) -> int:
    from daemon.tools.bench.plan import Plan
    from daemon.tools.bench.cpus import parse_cpus
    from daemon.tools.bench.e2e import run_bench
    from daemon.tools.bench.report import summary, write_outputs

    plan = Plan.build(args.config, args.out, args.requests, args.duration, args.rates, args.quick, args.only,
                      route=args.route, rounds=args.rounds, burst=args.burst,
                      consumer_cpus=parse_cpus(args.consumer_cpus) if args.consumer_cpus else (),
                      consumer_cpu_share=args.consumer_cpu_share, also=tuple(args.also))
    results = run_bench(plan)
    for path in write_outputs(results, args.out):
        print(f"wrote {path}", file=sys.stderr)
    print(summary(results))
    return EXIT_OK


def _cmd_bench_model(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from daemon.config.loader import load_config
    from daemon.tools.bench.model import bench_model, format_bench

    config = load_config(args.config)
    rows = bench_model(config, args.route, tuple(args.batch), args.threads, args.iterations,
                       progress=lambda msg: print(f"  timing {msg} ...", file=sys.stderr, flush=True))
    print(json.dumps([asdict(r) for r in rows]) if args.json else format_bench(rows))
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from daemon.tools.status import fetch, render

    if args.watch is not None:
        return _watch_status(args)
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


def _watch_status(args: argparse.Namespace) -> int:
    """`status --watch`: the table redrawn until Ctrl-C (or SIGTERM)."""
    import threading

    from daemon.tools.status import NodeFeed
    from daemon.tools.status_watch import watch

    if args.watch <= 0:
        print("error: --watch: SECONDS must be above 0", file=sys.stderr)
        return EXIT_FAIL
    feed = NodeFeed(args.broker, args.client_id)
    try:
        feed.start()
    except OSError as exc:
        print(f"error: cannot reach the broker at {args.broker}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    heading = f"edge-inferd status --watch: {args.broker}, every {args.watch:g} s (Ctrl-C stops)"
    try:
        watch(feed, args.watch, sys.stdout, stop, heading)
    except KeyboardInterrupt:
        pass
    finally:
        feed.stop()
    return EXIT_OK


def _cmd_fleet(args: argparse.Namespace) -> int:
    if hasattr(args, "fleet_verb"):  # status, rollout, abort, rollback: the controller's exit statuses
        from daemon.fleet.controller.controller import run_from_args

        return run_from_args(args, sys.stdout)
    from daemon.fleet.controller.commands import run

    return EXIT_OK if run(args) else EXIT_FAIL


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.fleet:
        from daemon.tools.demo_fleet import run_fleet_demo

        return EXIT_OK if run_fleet_demo() else EXIT_FAIL
    from daemon.tools.demo import run_demo

    return EXIT_OK if run_demo(args.config, limit=args.limit, quiet=args.quiet, verbose=args.verbose) else EXIT_FAIL


_COMMANDS = {"run": _cmd_run, "check-config": _cmd_check, "validate": _cmd_validate, "inspect": _cmd_inspect,
             "bench": _cmd_bench,
             "status": _cmd_status, "fleet": _cmd_fleet, "demo": _cmd_demo}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from daemon.errors import ConfigError, DaemonError, ModelError

    args = cli_parser.build().parse_args(argv)
    _setup_logging(args)
    missing = _missing_default_config(args)
    if missing:
        print(missing, file=sys.stderr)
        sys.exit(EXIT_CONFIG)
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
