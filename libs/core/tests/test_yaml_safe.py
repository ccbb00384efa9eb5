"""flywheel.core.yaml_safe: ordinary YAML loads as with safe_load; alias bombs, deep
nesting, recursive anchors and oversized text are refused quickly with a clear reason."""

from __future__ import annotations

import time

import pytest
import yaml

from flywheel.core import yaml_safe


def bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines)


def test_ordinary_yaml_matches_safe_load():
    text = "defaults: &d {model: gpt, temperature: 0.2}\narms:\n  - <<: *d\n    name: a\n  - {name: b}\nn: 3\n"
    assert yaml_safe.load(text) == yaml.safe_load(text)
    assert yaml_safe.load("") is None
    assert yaml_safe.load(b"x: 1") == {"x": 1}


def test_billion_laughs_is_refused_before_it_is_built():
    started = time.monotonic()
    with pytest.raises(yaml_safe.YamlLimitError, match="expands to more than 100,000 nodes"):
        yaml_safe.load(bomb())
    assert time.monotonic() - started < 1
    # Fewer aliases than the limit but the same expansion: still refused by the node count.
    with pytest.raises(yaml_safe.YamlLimitError, match="expands"):
        yaml_safe.load(bomb(levels=6, width=10), max_aliases=1000)


@pytest.mark.parametrize(
    ("text", "kwargs", "reason"),
    [
        ("a: &a [1]\nb: *a", {"max_aliases": 0}, "anchors and aliases, which are not accepted"),
        ("[&x 1, " + ", ".join(["*x"] * 5) + "]", {"max_aliases": 3}, "more than 3 aliases"),
        ("a: &a [*a]", {}, "recursive alias"),
        ("[" * 100 + "]" * 100, {}, "nests deeper than 64 levels"),
        ("[" * 5000 + "]" * 5000, {}, "nests deeper than"),
        ("x: " + "y" * 2000, {"max_chars": 1000}, "is 2,003 characters; at most 1,000"),
        (b"x: \xff", {}, "is not valid UTF-8 at byte 3"),
    ],
)
def test_limits_are_refused_with_a_reason(text, kwargs, reason):
    with pytest.raises(yaml.YAMLError, match=reason):
        yaml_safe.load(text, **kwargs)


def test_parse_errors_stay_yaml_errors():
    with pytest.raises(yaml.YAMLError) as info:
        yaml_safe.load("name: [unclosed")
    assert not isinstance(info.value, yaml_safe.YamlLimitError)
