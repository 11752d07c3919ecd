"""bench e2e's consumer placement: CPU lists, the bench's own CPUs given back, a consumer pinned in its child."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from daemon.errors import DaemonError
from daemon.tools.bench.cpus import Placement, parse_cpus

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, cpus", [("1", (1,)), ("2,3", (2, 3)), ("2-4", (2, 3, 4)), ("3,1-2,3", (1, 2, 3))])
def test_cpu_lists(text, cpus):
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "1,,2"])
def test_a_bad_cpu_list_names_the_option(text):
    with pytest.raises(DaemonError, match="--consumer-cpus"):
        parse_cpus(text)


def test_nothing_asked_changes_nothing():
    with Placement() as placement:
        assert placement.preexec is None and sorted(os.sched_getaffinity(0)) == CPUS


def test_every_cpu_to_the_consumers_leaves_none_for_the_broker():
    with pytest.raises(DaemonError, match="left for the broker"):
        Placement(tuple(CPUS)).__enter__()
    assert sorted(os.sched_getaffinity(0)) == CPUS


def test_a_share_beyond_the_consumers_cpus_is_refused():
    with pytest.raises(DaemonError, match="--consumer-cpu-share"):
        Placement((CPUS[-1],), share=1.5)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs: one for the consumer, one for the bench")
def test_the_bench_takes_the_other_cpus_and_a_consumer_gets_its_own():
    mine = (CPUS[-1],)
    with Placement(mine) as placement:
        assert sorted(os.sched_getaffinity(0)) == CPUS[:-1]  # the broker and clients started now inherit these
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True, preexec_fn=placement.preexec)
    assert child.stdout.strip() == str(list(mine))
    assert sorted(os.sched_getaffinity(0)) == CPUS  # given back
