"""MQTT topic filters and reply-topic templates (pure; no paho).

We match topics ourselves instead of using paho's `message_callback_add` /
`topic_matches_sub`: those do not understand `$share/<group>/...` filters (paho issue
#472), and scale-out through shared subscriptions will need the bare filter anyway.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
WHOLE_TOPIC = "topic"
_MAX_TOPIC_BYTES = 65535  # MQTT's UTF-8 string limit


def filter_error(topic_filter: str) -> Optional[str]:
    """Why a subscription filter is invalid, or None when it is fine."""
    if not topic_filter:
        return "topic filter must not be empty"
    if len(topic_filter.encode()) > _MAX_TOPIC_BYTES:
        return "topic filter is longer than 65535 bytes"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return f"'#' must be a whole level and the last one, in {topic_filter!r}"
        if "+" in level and level != "+":
            return f"'+' must be a whole level, in {topic_filter!r}"
    return None


def match(topic_filter: str, topic: str) -> Optional[tuple[str, ...]]:
    """The '+' captures when `topic` matches `topic_filter`, else None."""
    captures = []
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    # MQTT: wildcards at the first level do not match topics starting with '$'.
    if topic.startswith("$") and f_levels[0] in ("+", "#"):
        return None
    for i, f in enumerate(f_levels):
        if f == "#":
            return tuple(captures)
        if i >= len(t_levels):
            return None
        if f == "+":
            captures.append(t_levels[i])
        elif f != t_levels[i]:
            return None
    return tuple(captures) if len(f_levels) == len(t_levels) else None


def wildcard_count(topic_filter: str) -> int:
    return topic_filter.split("/").count("+")


def template_error(template: str, captures: Optional[int]) -> Optional[str]:
    """Why a publish template is invalid for a filter with `captures` '+' levels (None: the
    filter is itself broken, so numbered placeholders are not counted against it)."""
    if not template:
        return "publish template must not be empty"
    if "+" in template or "#" in template:
        return "publish template must not contain '+' or '#'"
    for name in _placeholders(template):
        if name == WHOLE_TOPIC:
            continue
        if not name.isdigit() or int(name) < 1:
            return f"unknown placeholder {{{name}}}: use {{1}}, {{2}}, ... or {{topic}}"
        if captures is not None and int(name) > captures:
            return f"placeholder {{{name}}} but the subscribe filter has only {captures} '+' level(s)"
    return None


def _placeholders(template: str) -> Iterable[str]:
    return (m.group(1) for m in _PLACEHOLDER.finditer(template))


def render(template: str, topic: str, captures: tuple[str, ...]) -> str:
    """Fill `{1}`, `{2}`, ... with captures and `{topic}` with the request topic."""

    def fill(m: re.Match) -> str:
        name = m.group(1)
        return topic if name == WHOLE_TOPIC else captures[int(name) - 1]

    return _PLACEHOLDER.sub(fill, template)
