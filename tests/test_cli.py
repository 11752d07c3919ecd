"""The command line: option placement, the default config, log timestamps by $JOURNAL_STREAM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import cli, cli_parser

ROOT = Path(__file__).resolve().parents[1]
STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} INFO edge-inferd: hello$")


def _parse(*argv: str):
    return cli_parser.build().parse_args(argv)


@pytest.mark.parametrize("argv", [
    ("-v", "run", "--config", "x.yaml"),
    ("run", "-v", "--config", "x.yaml"),
    ("check-config", "-v", "--config", "x.yaml"),
    ("check-config", "--config", "x.yaml", "--verbose"),
    ("bench", "model", "--route", "activity", "-v"),
    ("-v", "demo"),
])
def test_verbose_before_or_after_the_command(argv):
    assert cli.log_level(_parse(*argv)) == "debug"


@pytest.mark.parametrize("argv", [
    ("--log-level", "warning", "run"),
    ("run", "--log-level", "warning"),
    ("-v", "run", "--log-level", "warning"),  # an explicit level wins over -v
    ("--log-level", "warning", "status", "-v"),
])
def test_log_level_before_or_after_the_command(argv):
    assert cli.log_level(_parse(*argv)) == "warning"


def test_no_logging_options_means_info():
    assert cli.log_level(_parse("run")) == "info"


def test_every_command_has_a_description_and_every_option_help():
    parser = cli_parser.build()
    commands = parser._subparsers._group_actions[0].choices
    groups = {group: commands[group]._subparsers._group_actions[0].choices for group in ("bench", "fleet")}
    nested = {f"{group} {k}": v for group, verbs in groups.items() for k, v in verbs.items()}
    for name, sub in {**commands, **nested}.items():
        assert sub.description, name
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings}"


def test_bench_soak_is_a_subcommand_with_the_soak_options():
    """`edge-inferd bench soak` (once scripts/soak.py): its -h runs without importing the bench, and
    its options parse to what daemon/tools/bench/soak.py reads."""
    done = subprocess.run([sys.executable, "-m", "daemon", "bench", "soak", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for option in ("--minutes", "--load", "--capacity-requests", "--repeat-share", "--warmup-minutes", "--out",
                   "--keep", "--config"):
        assert option in done.stdout, option
    args = _parse("bench", "soak", "--minutes", "0.5", "--load", "0.3", "--out", "s.json")
    assert (args.bench_command, args.minutes, args.load, args.capacity_requests, args.out, args.config) == \
        ("soak", 0.5, 0.3, 10_000, Path("s.json"), cli_parser.DEV_CONFIG)


def test_config_comes_from_the_env_else_the_default(monkeypatch):
    monkeypatch.delenv(cli_parser.CONFIG_ENV, raising=False)
    args = _parse("run")
    assert cli_parser.resolve_config(args) == "the default" and args.config == cli_parser.DEFAULT_CONFIG
    monkeypatch.setenv(cli_parser.CONFIG_ENV, "/srv/gw.yaml")
    args = _parse("check-config")
    assert cli_parser.resolve_config(args).endswith(cli_parser.CONFIG_ENV) and args.config == Path("/srv/gw.yaml")
    args = _parse("validate", "--config", "mine.yaml", "--route", "r", "--data", "d.npz")
    assert cli_parser.resolve_config(args) == "" and args.config == Path("mine.yaml")  # explicit wins
    assert _parse("demo").config == Path("config.yaml")  # the dev tools read the checkout's example


def test_a_missing_default_config_exits_78_naming_the_path(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(cli_parser.CONFIG_ENV, raising=False)
    monkeypatch.setattr(cli_parser, "DEFAULT_CONFIG", tmp_path / "config.yaml")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check-config"])
    assert exit_.value.code == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert str(tmp_path / "config.yaml") in err and "--config PATH" in err and cli_parser.CONFIG_ENV in err
    assert "Traceback" not in err


def test_env_config_is_used_and_an_explicit_config_wins():
    env = {**os.environ, cli_parser.CONFIG_ENV: str(ROOT / "config.yaml")}
    done = subprocess.run([sys.executable, "-m", "daemon", "check-config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(str(ROOT / "config.yaml")), done.stderr
    env[cli_parser.CONFIG_ENV] = "/nonexistent/edge-inferd.yaml"
    done = subprocess.run([sys.executable, "-m", "daemon", "check-config", "--config", "config.yaml"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_stderr_is_journal_compares_device_and_inode(tmp_path):
    with open(tmp_path / "stream", "w") as stream, open(tmp_path / "other", "w") as other:
        st = os.fstat(stream.fileno())
        journal = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert cli.stderr_is_journal(journal, stream.fileno())
        assert not cli.stderr_is_journal(journal, other.fileno())  # stderr redirected elsewhere
        assert not cli.stderr_is_journal({}, stream.fileno())
        assert not cli.stderr_is_journal({"JOURNAL_STREAM": "garbage"}, stream.fileno())


def _log_hello(tmp_path: Path, journal_stream: str | None) -> str:
    """One log line from a child whose stderr is a file, with $JOURNAL_STREAM as given ("self": the file's)."""
    path = tmp_path / "stderr.log"
    code = ("import argparse, logging; from daemon import cli; "
            "cli._setup_logging(argparse.Namespace(log_level=None, verbose=False)); "
            "logging.getLogger('edge-inferd').info('hello')")
    with open(path, "w") as stderr:
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal_stream == "self":
            st = os.fstat(stderr.fileno())
            journal_stream = f"{st.st_dev}:{st.st_ino}"
        if journal_stream:
            env["JOURNAL_STREAM"] = journal_stream
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=stderr, check=True, timeout=60)
    return path.read_text().rstrip("\n")


def test_log_lines_are_stamped_unless_stderr_is_the_journal(tmp_path):
    assert _log_hello(tmp_path, "self") == "INFO edge-inferd: hello"  # journald stamps it
    assert STAMPED.match(_log_hello(tmp_path, None))
    assert STAMPED.match(_log_hello(tmp_path, "1:2"))  # another stream's: stderr was redirected
