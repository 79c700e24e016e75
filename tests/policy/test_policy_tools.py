"""Which paths each file tool touches, and the hook's judgement of whole calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from libbroker.errors import HookInputError
from libpolicy.hook import check_call
from libpolicy.model import Policy
from libpolicy.tools import PatternRefused, glob_root, touched

TOUCHED = [
    ("Read", {"file_path": "/a/b"}, [("read", "/a/b")]),
    ("Read", {"file_path": "rel/b", "offset": 3, "limit": 9}, [("read", "rel/b")]),
    ("Write", {"file_path": "/a/b", "content": "x"}, [("write", "/a/b")]),
    ("Edit", {"file_path": "/a/b", "old_string": "x", "new_string": "y"}, [("write", "/a/b")]),
    ("MultiEdit", {"file_path": "/a/b", "edits": []}, [("write", "/a/b")]),
    ("NotebookEdit", {"notebook_path": "/a/n.ipynb", "new_source": ""},
     [("write", "/a/n.ipynb")]),
    ("Grep", {"pattern": "x"}, [("search", ".")]),
    ("Grep", {"pattern": "x", "path": ""}, [("search", ".")]),
    ("Grep", {"pattern": "x", "path": "/a"}, [("search", "/a")]),
    ("Grep", {"pattern": "x", "path": "/a", "glob": "*.py"}, [("search", "/a")]),
    ("Grep", {"pattern": "x", "path": "/a", "glob": "/h/.ssh/*"},
     [("search", "/a"), ("search", "/h/.ssh")]),
    ("Grep", {"pattern": "x", "glob": "*.py ~/.ssh/*"}, [("search", "."), ("search", "~/.ssh")]),
    ("Glob", {"pattern": "**/*.py"}, [("search", ".")]),
    ("Glob", {"pattern": "src/**/*.py", "path": "/a"}, [("search", "/a/src")]),
    ("Glob", {"pattern": "/h/.ssh/*"}, [("search", "/h/.ssh")]),
    ("Glob", {"pattern": "/h/.ssh/id_rsa", "path": "/a"}, [("search", "/h/.ssh")]),
    ("Glob", {"pattern": "../../h/*", "path": "/a/b"}, [("search", "/a/b/../../h")]),
    ("Glob", {"pattern": "~/.ssh/*", "path": "/a"},
     [("search", "/a/~/.ssh"), ("search", "~/.ssh")]),
    ("Glob", {"pattern": "/*"}, [("search", "/")]),
    ("Glob", {"pattern": "name.txt", "path": "/a"}, [("search", "/a")]),
    ("Bash", {"command": "cat /h/.ssh/id"}, []),
    ("TodoWrite", {"todos": []}, []),
    ("WebFetch", {"url": "http://x"}, []),
]


@pytest.mark.parametrize(("tool", "tool_input", "expected"), TOUCHED)
def test_touched(tool: str, tool_input: dict[str, object], expected: list[tuple[str, str]]) -> None:
    assert touched(tool, tool_input) == expected


@pytest.mark.parametrize(("tool", "tool_input"), [
    ("Read", {}),
    ("Read", {"file_path": 3}),
    ("Read", {"file_path": ""}),
    ("Write", {"file_path": ["/a"]}),
    ("NotebookEdit", {"file_path": "/a.ipynb"}),
    ("Glob", {"path": "/a"}),
    ("Grep", {"pattern": "x", "path": 7}),
    ("Grep", {"pattern": "x", "glob": {"a": 1}}),
])
def test_unusable_tool_input(tool: str, tool_input: dict[str, object]) -> None:
    with pytest.raises(HookInputError):
        touched(tool, tool_input)


@pytest.mark.parametrize("pattern", ["*/../../h/*", "{..,x}/id", "src/*/../../../h"])
def test_glob_climbing_after_a_wildcard_is_refused(pattern: str) -> None:
    with pytest.raises(PatternRefused):
        glob_root("/a", pattern)


CALLS = [
    ("Read", {"file_path": "{P}/src/main.py"}, None),
    ("Read", {"file_path": "{H}/.ssh/id"}, "reading"),
    ("Read", {"file_path": "../.ssh/id"}, "reading"),
    ("Write", {"file_path": "{P}/src/x.py", "content": ""}, None),
    ("Write", {"file_path": "{H}/.bashrc", "content": ""}, "writing"),
    ("Edit", {"file_path": "{P}/secret/index", "old_string": "", "new_string": ""}, "writing"),
    ("MultiEdit", {"file_path": "{P}/to_ssh/authorized_keys", "edits": []}, "writing"),
    ("NotebookEdit", {"notebook_path": "{P}/src/n.ipynb", "new_source": ""}, None),
    ("NotebookEdit", {"notebook_path": "{H}/.claude/n.ipynb", "new_source": ""}, "writing"),
    ("Write", {"file_path": "{H}/.claude/memory/MEMORY.md", "content": ""}, None),
    ("Grep", {"pattern": "KEY"}, "searching"),  # the workdir holds a deny path
    ("Grep", {"pattern": "KEY", "path": "src"}, None),
    ("Grep", {"pattern": "KEY", "path": "{R}"}, "searching"),  # an ancestor of home
    ("Grep", {"pattern": "KEY", "path": "/"}, "searching"),
    ("Grep", {"pattern": "KEY", "path": "src", "glob": "{H}/.ssh/*"}, "searching"),
    ("Glob", {"pattern": "**/*.py", "path": "{P}/src"}, None),
    ("Glob", {"pattern": "{H}/.ssh/*"}, "searching"),  # an absolute pattern
    ("Glob", {"pattern": "{H}/.config/gh/*"}, None),
    ("Glob", {"pattern": "../.ssh/*", "path": "{P}/src/.."}, "searching"),
    ("Glob", {"pattern": "*/../../.ssh/*", "path": "{P}/src"}, "climbs"),
    ("Glob", {"pattern": "~/.ssh/*", "path": "{P}/src"}, "searching"),
    ("Bash", {"command": "cat ~/.ssh/id"}, None),
]


@pytest.mark.parametrize(("tool", "raw_input", "fragment"), CALLS)
def test_check_call(world: tuple[Path, Policy], tool: str, raw_input: dict[str, object],
                    fragment: str | None) -> None:
    root, policy = world

    def fill(value: object) -> object:
        if not isinstance(value, str):
            return value
        return (value.replace("{H}", policy.home).replace("{P}", policy.write[0])
                .replace("{R}", str(root)))

    tool_input = {k: fill(v) for k, v in raw_input.items()}
    reason = check_call(policy, tool, tool_input, policy.write[0])
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason
        assert "agent-sandbox policy" in reason and "instead" in reason
