"""Where a setting came from (pure): the line of each key in the TOML shapes people write."""

from __future__ import annotations

import tomllib

import pytest

from libbroker.launcher.origins import Origins, key_lines, toml_error, utf8_error

TEXT = """\
# agent-sandbox
sandbox = "nono"
"domains" = [
  "github.com",
]
limits.memory = "1G"

[limits]
tasks = 4096

[agents.mine]
commands = ["aider"]

[[secret]]
host = "a.example"
header = "x-k"

[[ secret ]]   # spaced, with a comment
host = "b.example"
command = "echo k"
"""


def test_key_lines_finds_each_shape() -> None:
    tomllib.loads(TEXT.replace('limits.memory = "1G"\n', ""))  # the rest is valid TOML
    lines = key_lines(TEXT)
    assert lines[("", "sandbox")] == 2
    assert lines[("", "domains")] == 3  # a quoted key; its array's items are no keys
    assert lines[("", "limits")] == 6  # a dotted key names its table first
    assert lines[("limits", "tasks")] == 9
    assert lines[("agents.mine", "")] == 11 and lines[("", "agents")] == 11
    assert lines[("secret#1", "")] == 14 and lines[("secret#1", "header")] == 16
    assert lines[("secret#2", "")] == 18 and lines[("secret#2", "command")] == 20


def test_labels_prefer_the_flag_then_the_file_then_the_default() -> None:
    where = Origins(frozenset({"sandbox", "limits", "agents", "secret"}), file="/c.toml",
                    lines=key_lines(TEXT), flags={"workdir": "--workdir"})
    assert where("workdir") == "--workdir"
    assert where("sandbox") == "/c.toml line 2: sandbox"
    assert where("limits", "tasks") == "/c.toml line 9: limits.tasks"
    assert where("limits", "cpu") == "/c.toml line 6: limits.cpu"  # the key's first line
    assert where("agents", "mine") == "/c.toml line 11: agents.mine"
    assert where.secret(2, "b.example") == "/c.toml line 18: [[secret]] #2 (b.example)"
    assert where("domains") == "domains (default)"
    assert Origins()("workdir") == "workdir (default: the current directory)"
    assert Origins(frozenset({"sandbox"}))("sandbox") == "sandbox"  # a mapping, no file
    assert where.place("bogus") == "/c.toml: "
    assert Origins().place("bogus") == ""


@pytest.mark.parametrize(("text", "where"), [
    ("a = 1 ; b = 2\n", "line 1, column 7"),
    ("x = [1,\n", "at its end"),
    ('a = "x\n', "line 1, column 7"),
])
def test_bad_toml_is_named_by_file_line_and_column(text: str, where: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError) as info:
        tomllib.loads(text)
    line = toml_error("/c.toml", str(info.value))
    assert line.startswith(f"/c.toml {where}: not valid TOML: ") and "(at " not in line


def test_a_byte_that_is_not_utf8_is_named_by_line_column_and_value() -> None:
    raw = b'a = "\xc3\xa9"\nb = "x\xffy"\n'
    with pytest.raises(UnicodeDecodeError) as info:
        raw.decode("utf-8")
    assert utf8_error("/c.toml", raw, info.value) == (
        "/c.toml line 2, column 7: not UTF-8 (byte 0xff); TOML files are UTF-8")
