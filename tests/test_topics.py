"""Topic filters, '+' captures and publish templates."""

from __future__ import annotations

from daemon import topics


def test_match_captures_plus_levels():
    assert topics.match("sensors/+/imu", "sensors/w1/imu") == ("w1",)
    assert topics.match("a/+/b/+", "a/x/b/y") == ("x", "y")
    assert topics.match("a/#", "a/x/y/z") == ()
    assert topics.match("a/+/#", "a/x") == ("x",)
    assert topics.match("sensors/+/imu", "sensors/w1/imu/raw") is None
    assert topics.match("sensors/+/imu", "sensors/imu") is None
    assert topics.match("+/x", "$SYS/x") is None  # wildcards never match $-topics at level one


def test_filter_errors():
    assert topics.filter_error("a/+/b/#") is None
    assert "whole level" in topics.filter_error("a/b#")
    assert "last one" in topics.filter_error("a/#/b")
    assert "'+' must be a whole level" in topics.filter_error("a/x+/b")
    assert topics.filter_error("") is not None


def test_templates():
    assert topics.render("out/{2}/{1}/{topic}", "a/x/b/y", ("x", "y")) == "out/y/x/a/x/b/y"
    assert topics.template_error("out/{1}", 1) is None
    assert "only 1" in topics.template_error("out/{2}", 1)
    assert "unknown placeholder {name}" in topics.template_error("out/{name}", 1)
    assert "must not contain" in topics.template_error("out/+", 1)
