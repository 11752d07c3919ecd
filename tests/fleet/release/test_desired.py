"""Desired documents: parsing, the rev order, and the merge of a node's document with its groups'."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from daemon.fleet.release import desired
from daemon.fleet.node.commands_node import DocBook


def doc(rev, **models) -> bytes:
    return json.dumps({"rev": rev, "models": models}).encode()


def entry(serial, url="http://r.local/m/"):
    return {"url": f"{url}{serial}/", "serial": serial}


def test_a_document_parses_into_targets():
    parsed = desired.parse_desired(doc(3, activity=entry(4), other=None), "node")
    assert parsed.rev == 3
    assert parsed.models["activity"] == desired.Target("http://r.local/m/4/", 4, "node")
    assert parsed.models["other"] is None
    assert parsed.models["activity"].manifest_url == "http://r.local/m/4/manifest.json"


def test_an_empty_payload_is_a_deleted_document():
    assert desired.parse_desired(b"", "node") is None


@pytest.mark.parametrize("payload, words", [
    (b"{", "not JSON"),
    (b"[]", "JSON object"),
    (json.dumps({"models": {}}).encode(), "rev"),
    (json.dumps({"rev": -1}).encode(), "rev"),
    (json.dumps({"rev": True}).encode(), "rev"),
    (json.dumps({"rev": 1, "models": []}).encode(), "models"),
    (json.dumps({"rev": 1, "models": {"m": {"url": "ftp://x/"}}}).encode(), "models.m.url"),
    (json.dumps({"rev": 1, "models": {"m": {"url": "http://x/", "serial": "4"}}}).encode(), "models.m.serial"),
    (json.dumps({"rev": 1, "models": {"m": 7}}).encode(), "models.m"),
])
def test_a_malformed_document_is_refused_with_the_reason(payload, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        desired.parse_desired(payload, "node")


@given(st.binary(max_size=200))
def test_parsing_never_raises_anything_but_value_error(payload):
    try:
        desired.parse_desired(payload, "node")
    except ValueError:
        pass


def test_the_node_wins_then_the_first_group_listed():
    docs = {"node": desired.parse_desired(doc(1, a=entry(1)), "node"),
            "group/hall": desired.parse_desired(doc(1, a=entry(2), b=entry(3), c=entry(5)), "group/hall"),
            "group/site": desired.parse_desired(doc(1, b=entry(4), d=entry(6)), "group/site")}
    merged = desired.merge(docs, ["hall", "site"])
    assert {name: t.serial for name, t in merged.items()} == {"a": 1, "b": 3, "c": 5, "d": 6}
    assert merged["b"].source == "group/hall"
    assert desired.merge(docs, ["site", "hall"])["b"].serial == 4


def test_null_in_the_node_document_takes_the_groups_target_away():
    docs = {"node": desired.parse_desired(doc(1, a=None), "node"),
            "group/hall": desired.parse_desired(doc(1, a=entry(2)), "group/hall")}
    assert desired.merge(docs, ["hall"]) == {}


def test_a_group_the_node_is_not_in_is_ignored():
    docs = {"group/other": desired.parse_desired(doc(1, a=entry(2)), "group/other")}
    assert desired.merge(docs, ["hall"]) == {}


def test_the_book_takes_a_higher_rev_only_and_remembers_across_a_restart(tmp_path):
    book = DocBook(tmp_path)
    assert book.take("node", desired.parse_desired(doc(5, a=entry(1)), "node")) == ["a"]
    assert book.take("node", desired.parse_desired(doc(5, a=entry(2)), "node")) == []  # a replay
    assert book.take("node", desired.parse_desired(doc(4, a=entry(3)), "node")) == []  # stale
    again = DocBook(tmp_path)
    assert again.revs() == {"node": 5}
    assert desired.merge(again.docs, [])["a"].serial == 1
    assert again.take("node", desired.parse_desired(doc(6, a=entry(1), b=entry(9)), "node")) == ["b"]
    assert again.take("node", None) == []  # a deleted retained document changes nothing
