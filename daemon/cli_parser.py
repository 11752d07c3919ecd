"""The `edge-inferd` command line: every subcommand, option and help text (cli.py runs them).

`-v`/`--verbose` and `--log-level` are accepted before or after the subcommand: each
subparser gets its own copies with `default=argparse.SUPPRESS`, so a subcommand that was
not given them leaves the main parser's value alone.

`--config` of the service commands (run, check-config, validate) defaults to
`$EDGE_INFERD_CONFIG`, else /etc/edge-inferd/config.yaml, where install.sh puts it. The dev
tools (demo, bench) read config.yaml in the current directory, the checkout's example.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from daemon import __version__

DEFAULT_CONFIG = Path("/etc/edge-inferd/config.yaml")
CONFIG_ENV = "EDGE_INFERD_CONFIG"
DEV_CONFIG = Path("config.yaml")
LOG_LEVELS = ("debug", "info", "warning", "error")
# `fleet sign --claim-metric`: what `edge-inferd validate` prints by output kind (daemon/fleet/release/release.py
# METRICS, which a node checks; written here so `edge-inferd -h` does not import the fleet).
CLAIM_METRICS = ("accuracy", "roc_auc", "mae")
# bench e2e's phases (daemon/tools/bench/plan.py: the first four run by default) and its --also
# consumers (daemon/tools/bench/e2e.py ALSO); written here so `edge-inferd -h` does not import the bench.
BENCH_ALSO = ("echo-v5", "naive-v5", "daemon-paho", "daemon-paho-v5", "daemon-native")
ALL_BENCH_PHASES = ("drain", "openloop", "cache", "batching", "burst30k", "overload", "openloop1000", "cachepair")

_FORMATTER = argparse.RawDescriptionHelpFormatter  # keeps the examples' line breaks


def build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-inferd", formatter_class=_FORMATTER,
        description="MQTT inference daemon for INT8 TFLite models.",
        epilog="Run `edge-inferd COMMAND -h` for a command's options and an example.\n"
               "Exit codes: 0 ok; 1 failed (a gate, the broker); 78 an invalid config or model\n"
               "(systemd does not restart on it); 130 a forced stop (a second Ctrl-C).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_logging_options(parser, main=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    _add_run(sub)
    _add_check(sub)
    _add_validate(sub)
    _add_inspect(sub)
    _add_bench(sub)
    _add_status(sub)
    _add_fleet(sub)
    _add_demo(sub)
    return parser


def resolve_config(args: argparse.Namespace) -> str:
    """Fill in the default `--config` of a service command; says where it came from ('' when given)."""
    if getattr(args, "config", DEV_CONFIG) is not None:
        return ""
    from_env = os.environ.get(CONFIG_ENV)
    args.config = Path(from_env) if from_env else DEFAULT_CONFIG
    return f"from ${CONFIG_ENV}" if from_env else "the default"


def _add_logging_options(parser: argparse.ArgumentParser, main: bool = False) -> None:
    """The main parser holds the defaults; a subparser's copies are SUPPRESSed (see the docstring)."""
    group = parser.add_argument_group("logging (before or after the command)")
    group.add_argument("-v", "--verbose", action="store_true", default=False if main else argparse.SUPPRESS,
                       help="debug logging, the same as --log-level debug")
    group.add_argument("--log-level", choices=LOG_LEVELS, default=None if main else argparse.SUPPRESS,
                       help="log this level and above on stderr (default info; wins over -v)")


def _command(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
             example: str = "") -> argparse.ArgumentParser:
    """A subcommand: `summary` for the list in the parent's -h, `description` and `example` for its own -h."""
    if example:
        description += f"\n\nexample:\n  {example}"
    parser = sub.add_parser(name, help=summary, description=description, formatter_class=_FORMATTER)
    _add_logging_options(parser)
    return parser


def _add_service_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, metavar="PATH",
                        help=f"the YAML config (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG})")


def _add_dev_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEV_CONFIG, metavar="PATH",
                        help="the YAML config (default: config.yaml in the current directory, the checkout's "
                             f"example; a dev tool, unlike `run`, which reads {DEFAULT_CONFIG})")


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = _command(sub, "run", "run the daemon", (
        "Connect to the broker, subscribe to every route and answer requests until SIGTERM or SIGINT\n"
        "(SIGHUP reloads the config and models). systemd runs this; it logs to stderr."),
        example="edge-inferd run --config config.yaml --broker localhost:1883")
    _add_service_config(run)
    run.add_argument("--broker", metavar="ADDRESS", help="the broker to use instead of the config's mqtt.broker: "
                     "HOST[:PORT], [V6]:PORT, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS)")


def _add_check(sub: argparse._SubParsersAction) -> None:
    check = _command(sub, "check-config", "validate a config; exit 0, or 78 listing every error", (
        "Read the config and load every model. Prints one line and exits 0 when it is valid;\n"
        "otherwise prints every error as `key.path: message (line N)` and exits 78."),
        example="edge-inferd check-config --config /etc/edge-inferd/config.yaml --deep")
    _add_service_config(check)
    check.add_argument("--deep", action="store_true",
                       help="also run each model once and every route's validate gate (what a reload checks)")


def _add_validate(sub: argparse._SubParsersAction) -> None:
    val = _command(sub, "validate", "how well a route's whole pipeline does on labelled data", (
        "Run a route's whole pipeline (decode, preprocess, quantize, infer) on x of an .npz and\n"
        "compare with y, by the route's output kind: classify -> accuracy against integer labels;\n"
        "anomaly -> ROC-AUC against 0 normal / 1 anomalous and the threshold at --fpr; values ->\n"
        "MAE and RMSE against the targets; detect -> precision and recall at IoU 0.5 against boxes\n"
        "(an .npz of image_0, image_1, ... picture bytes and boxes (M, 6): image, class, x_min,\n"
        "y_min, x_max, y_max). Prints one JSON object (with n, model_sha256); exits 1\n"
        "below the gate (--min-accuracy, --min-roc-auc, --max-mae, or --max-drop below --float)."),
        example="edge-inferd validate --config config.yaml --route activity --data models/activity/test.npz")
    _add_service_config(val)
    val.add_argument("--route", required=True, metavar="NAME", help="the route's name in the config")
    val.add_argument("--data", required=True, type=Path, metavar="FILE.npz",
                     help=".npz with x (N, *input.shape) in sensor units and y (N,) integer labels")
    val.add_argument("--float", dest="float_model", type=Path, metavar="F.tflite",
                     help="float reference model: also report its accuracy and gate on the drop")
    val.add_argument("--max-drop", type=float, default=0.01, help="max accuracy drop vs --float (default 0.01)")
    val.add_argument("--min-accuracy", type=float, default=0.0, help="classify: fail below this accuracy (default 0)")
    val.add_argument("--min-roc-auc", type=float, default=0.0,
                     help="anomaly (y: 0 normal, 1 anomalous): fail below this ROC-AUC (default 0)")
    val.add_argument("--fpr", type=float, default=0.05,
                     help="anomaly: report the threshold at this false-positive rate on the normals (default 0.05)")
    val.add_argument("--max-mae", type=float, help="values (y: the targets): fail above this mean absolute error")


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    ins = _command(sub, "inspect", "what a .tflite model takes and gives, and a route that serves it", (
        "Print each input and output of a model (name, dtype, shape, quantization, the real values\n"
        "its integers stand for), its ops, the kind it looks like (classifier, SSD or YOLO detector,\n"
        "autoencoder, stateful: not supported), any reason edge-inferd would refuse it, and a\n"
        "models: + routes: snippet that check-config accepts."),
        example="edge-inferd inspect models/activity/model.tflite")
    ins.add_argument("model", type=Path, metavar="MODEL.tflite", help="the model file")
    ins.add_argument("--runtime", default="auto", choices=("auto", "litert", "tflite"),
                     help="the TFLite backend to read it with (default auto)")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = _command(sub, "bench", "model and end-to-end benchmarks (dev tools)", (
        "Benchmarks: `bench model` times one model's invokes, `bench e2e` the whole daemon over MQTT,\n"
        "`bench soak` the daemon under open-loop load for minutes (memory, fds, threads, every request answered)."))
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH",
                                     help="model, e2e or soak")
    bm = _command(bench_sub, "model", "per-invoke latency per backend, threads and batch", (
        "Time a route's model per installed backend, thread count and batch size (p50/p99 per invoke)."),
        example="edge-inferd bench model --route appliance --batch 1 8 --iterations 300")
    _add_dev_config(bm)
    bm.add_argument("--route", required=True, metavar="NAME", help="the route whose model is timed")
    bm.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    bm.add_argument("--threads", type=int, nargs="+", help="interpreter threads (default 1..cores)")
    bm.add_argument("--iterations", type=int, default=200, help="invokes timed per row (default 200)")
    bm.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    _add_bench_e2e(bench_sub)
    _add_bench_soak(bench_sub)


def _add_bench_soak(bench_sub: argparse._SubParsersAction) -> None:
    soak = _command(bench_sub, "soak", "the daemon under open-loop load for minutes: RSS, fds, threads, losses", (
        "A private mosquitto and `edge-inferd run` on a copy of the config (the activity and appliance\n"
        "routes): capacity by a closed drain, then open-loop requests at --load x capacity for --minutes,\n"
        "the daemon's RSS, open fds and threads read every ~5 s. Exit 1 unless, after the warm-up, RSS\n"
        "grew < 10 MB, fds and threads stayed within 2, every request was answered and no reply was an\n"
        "error other than overloaded/expired (daemon/tools/bench/soak.py). --minutes 0.5 is a quick smoke."),
        example="edge-inferd bench soak --minutes 10 --load 0.8 --out soak.json")
    _add_dev_config(soak)
    soak.add_argument("--minutes", type=float, default=10.0, help="open-loop duration (default 10)")
    soak.add_argument("--load", type=float, default=0.8, help="share of the measured capacity (default 0.8)")
    soak.add_argument("--capacity-requests", type=int, default=10_000, help="size of the closed drain")
    soak.add_argument("--repeat-share", type=float, default=0.1, help="requests that repeat the previous data")
    soak.add_argument("--warmup-minutes", type=float, help="samples before this are not judged "
                      "(default: 1 minute, or 10%% of a shorter run)")
    soak.add_argument("--out", type=Path, help="write the report (with every /proc sample) as JSON here")
    soak.add_argument("--keep", action="store_true", help="keep the work dir (daemon and broker logs)")


def _add_bench_e2e(bench_sub: argparse._SubParsersAction) -> None:
    be = _command(bench_sub, "e2e", "echo floor, naive script and the daemon over one private mosquitto", (
        "Start a private mosquitto and compare the paho echo floor, a naive one-file script and the\n"
        "daemon on one JSON route of a config (distinct requests from its validate data, else its\n"
        "input shape): drain rate of a burst, open-loop latency, cache and batching; with --only, also\n"
        "burst30k, overload, openloop1000 and cachepair on the config as written (docs/performance.md)."),
        example="edge-inferd bench e2e --route gunpoint --rounds 3 --only drain")
    _add_dev_config(be)
    be.add_argument("--route", default="activity", metavar="NAME",
                    help="the route to load, a JSON one (default activity); batching always uses appliance-raw")
    be.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="run the selected phases N times, consumers alternating; medians reported (default 1)")
    be.add_argument("--requests", type=int, help="requests per burst (default 5000)")
    be.add_argument("--burst", type=int, help="requests of the burst30k phase (default 30000)")
    be.add_argument("--duration", type=float,
                    help="seconds per open-loop rate (default 5; 2x for 2x capacity and for overload)")
    be.add_argument("--rates", nargs="+", help='open-loop rates: "1000" req/s or "0.5x" the daemon\'s drain rate')
    be.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    be.add_argument("--only", action="append", choices=ALL_BENCH_PHASES, metavar="PHASE",
                    help=f"run only this phase: {', '.join(ALL_BENCH_PHASES)} (repeatable; default: the first "
                         "four; openloop also runs drain, which sets its rates)")
    be.add_argument("--consumer-cpus", metavar="CPUS",
                    help="run the consumers on these CPUs (1, 2,3 or 2-3) and the broker and load on the others")
    be.add_argument("--consumer-cpu-share", type=float, metavar="F",
                    help="cap the consumers at F of one CPU (a cgroup, as systemd's CPUQuota=; needs root), so "
                         "that 2x their capacity is a load the broker carries (docs/performance.md)")
    be.add_argument("--also", action="append", default=[], choices=BENCH_ALSO, metavar="CONSUMER",
                    help=f"measure this consumer too: {', '.join(BENCH_ALSO)} (repeatable; the v5 baselines run "
                         "MQTT v5 with TCP_NODELAY, echo and naive run paho's defaults)")
    be.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder (default bench-out/)")


def _add_status(sub: argparse._SubParsersAction) -> None:
    status = _command(sub, "status", "a node's retained status and stats, as a table", (
        "Read the retained edge-inferd/<client_id>/status and .../stats topics from the broker\n"
        "and print them as a table. Exits 1 when the broker is unreachable or has no node. With --watch,\n"
        "stay subscribed and redraw the table (requests/s, p50/p99, errors by code, queue, workers,\n"
        "drift) every few seconds, as the nodes publish their stats (every stats_interval_s)."),
        example="edge-inferd status --broker gateway.local:1883 --client-id edge-inferd-gw1 --watch")
    status.add_argument("--broker", default="localhost:1883", metavar="ADDRESS",
                        help="the broker: HOST[:PORT], mqtt://... or mqtts://... (default localhost:1883)")
    status.add_argument("--client-id", metavar="ID",
                        help="the node's mqtt.client_id (default: every node on the broker)")
    status.add_argument("--watch", nargs="?", const=2.0, type=float, metavar="SECONDS",
                        help="keep following the nodes and redraw their table every SECONDS (default 2; "
                             "80 columns; Ctrl-C stops)")


def _add_fleet(sub: argparse._SubParsersAction) -> None:
    """`fleet VERB`: one _add_fleet_<verb> per verb (cli.py dispatches on `fleet_command`)."""
    fleet = _command(sub, "fleet", "signed model releases for a fleet of nodes (docs/fleet.md)", (
        "Fleet delivery: make a signing key, sign a release directory for an HTTP(S) server, roll it out\n"
        "over the broker in waves, watch every node's state, abort, roll back."))
    verbs = fleet.add_subparsers(dest="fleet_command", required=True, metavar="VERB", help="one of:")
    _add_fleet_keygen(verbs)
    _add_fleet_sign(verbs)
    from daemon.fleet.controller.controller import add_fleet_controller_args  # the operator's verbs, with their options

    add_fleet_controller_args(verbs)


def _add_fleet_keygen(verbs: argparse._SubParsersAction) -> None:
    keygen = _command(verbs, "keygen", "a new minisign key pair for signing releases", (
        "Write PREFIX.key (the secret key, mode 0600; unencrypted unless --password-file) and PREFIX.pub,\n"
        "minisign's own formats, and print the public key line for fleet.trusted_keys. Never overwrites."),
        example="edge-inferd fleet keygen --out keys/release-1")
    keygen.add_argument("--out", required=True, type=Path, metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub")
    keygen.add_argument("--comment", metavar="TEXT", help="the public key file's untrusted comment")
    keygen.add_argument("--password-file", type=Path, metavar="FILE",
                        help="encrypt the secret key with the password in FILE (its first line; scrypt, as minisign)")


def _add_fleet_sign(verbs: argparse._SubParsersAction) -> None:
    sign = _command(verbs, "sign", "make a signed release directory, or add a signature to one", (
        "Copy the model (and labels) into --out, read the model's interface as the daemon loads it, and\n"
        "write manifest.json and manifest.json.minisig (trusted comment model=M version=V serial=N).\n"
        "With --add-signature, append this key's signature to the release in --out (fleet.threshold > 1)."),
        example="edge-inferd fleet sign --key keys/release-1.key --model-file model.tflite --labels labels.txt "
                "--name activity --version 1.3.0 --serial 4 --out releases/activity/4")
    sign.add_argument("--key", required=True, type=Path, metavar="K.key", help="the minisign secret key")
    sign.add_argument("--password-file", type=Path, metavar="FILE", help="the key's password, when it is encrypted")
    sign.add_argument("--out", required=True, type=Path, metavar="DIR", help="the release directory")
    sign.add_argument("--add-signature", action="store_true",
                      help="sign the existing release in --out (the options below are not used)")
    sign.add_argument("--model-file", type=Path, metavar="M.tflite", help="the model (needed unless --add-signature)")
    sign.add_argument("--labels", type=Path, metavar="L", help="the labels file (optional)")
    sign.add_argument("--name", metavar="MODEL", help="the model's name in the nodes' configs (models.<name>)")
    sign.add_argument("--version", metavar="V", help="the release's version, e.g. 1.3.0 (no spaces)")
    sign.add_argument("--serial", type=int, metavar="N", help="higher than every earlier release of this model")
    sign.add_argument("--claim-data", type=Path, metavar="F.npz",
                      help="with --claim-metric and --claim-value: the .npz `edge-inferd validate` measured on")
    sign.add_argument("--claim-metric", choices=CLAIM_METRICS, help="the metric validate printed")
    sign.add_argument("--claim-value", type=float, metavar="X", help="its value")
    sign.add_argument("--summary", default="", metavar="TEXT", help="what changed, for operators")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = _command(sub, "demo", "private broker + daemon + replay of the bundled test data", (
        "Start a private mosquitto and the daemon, send each route its model's held-out samples as a\n"
        "client would (16 requests outstanding), and JPEGs to a camera route on the SSD that\n"
        "scripts/fetch_test_models.sh fetches (when it is there), print the first replies of each\n"
        "route and a summary by output kind, and stop. What ./scripts/demo.sh runs; -v prints every reply."),
        example="edge-inferd demo --limit 10")
    _add_dev_config(demo)
    demo.add_argument("--limit", type=int, default=0, help="samples per route at most (default: all; anomaly 200, values 5)")
    demo.add_argument("--quiet", action="store_true", help="print only the summary")
    demo.add_argument("--fleet", action="store_true",
                      help="the fleet demo instead: three daemons, a release rolled out in waves, a bad one "
                           "stopped by the gate on the first wave (docs/fleet.md)")
