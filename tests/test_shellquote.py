"""The one quoting of printed commands: hostile names through a real bash, byte for byte."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libbroker.shellquote import command, quote, shown

HOSTILE: list[bytes] = [
    b"plain", b"a.b-c_d/e@f%g+h=i:j,k", b"", b"x y", b"x  y\tz", b"it's", b"'", b"''", b'"',
    b"a;touch PWNED;b", b"x y;touch PWNED;z", b"$(touch PWNED)", b"`touch PWNED`", b"${HOME}",
    b"$HOME", b"-rf", b"--", b"-", b"~", b"~root", b"*", b"?", b"[a]", b"a\\b", b"\\", b"!",
    b"!!", b"a!b", b"!-1", b"#x", b"x#", b"&", b"|", b"<x>", b"(x)", b"{a,b}", b"a=b",
    b"line1\nline2", b"\n", b"a\rb", b"\r", b"\x1b[31mred\x1b[0m", b"\x1b]0;title\x07",
    b"\x1b]52;c;dG91Y2ggUFdORUQ=\x07", b"\x07", b"\x7f", b"\x08\x08\x08ok", b"\xc2\x9b31m",
    b"\xff\xfe", b"caf\xc3\xa9", b"caf\xe9", b"\xe2\x80\xaeevil", b"zero\xe2\x80\x8bwidth",
    b"nb\xc2\xa0sp", b"\xf0\x9f\x98\x80", b"'$'\\x41'", b"$'\\n'", b"x\\'y",
]


def controls(text: str) -> list[str]:
    """The characters a terminal would act on (C0, DEL, C1) or that are not UTF-8 text."""
    return [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c)
            <= 0xDFFF]


def bash(script: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True,
                          cwd=cwd, check=False, env={"PATH": os.environ["PATH"], "HOME": "/x"})


def printf_script(words: list[str | bytes]) -> str:
    """One ``printf '%s\\0' WORD`` line per word: what a person would paste."""
    return "".join(f"printf '%s\\0' {quote(w)}\n" for w in words)


def test_a_real_bash_reads_back_the_bytes(tmp_path: Path) -> None:
    words: list[str | bytes] = [*HOSTILE, *(os.fsdecode(raw) for raw in HOSTILE)]
    script = printf_script(words)
    assert not controls(script.replace("\n", ""))
    assert bash("set -n\n" + script).returncode == 0  # bash -n: every line parses
    done = bash(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(b"\0")[:-1] == HOSTILE * 2  # each word, exactly its bytes
    assert not (tmp_path / "PWNED").exists()


def test_plain_names_stay_readable() -> None:
    assert quote("src/main.py") == "src/main.py"
    assert quote("x y") == "'x y'"
    assert quote("it's") == "'it'\"'\"'s'"
    assert quote("café") == "'café'"
    assert quote(b"\x1b]52;c;x\x07") == "$'\\x1b]52;c;x\\x07'"
    assert quote(b"caf\xe9") == "$'caf\\xe9'"
    assert quote("a\nb!") == "$'a\\x0ab\\x21'"


def test_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        quote(b"a\0b")


def test_a_printed_command_does_what_it_says(tmp_path: Path) -> None:
    """The sweep's "mv -T -- saved path" line, pasted, moves exactly that file."""
    for name in HOSTILE[3:]:
        if name in (b"", b"-", b"--", b"~", b"!", b"!!", b"!-1") or b"/" in name:
            continue
        work = tmp_path / "w"
        work.mkdir()
        src = work / os.fsdecode(b"saved " + name)
        src.write_bytes(b"keep")
        dst = os.fsencode(work) + b"/" + name
        line = command("mv", "-T", "--", str(src), dst)
        assert not controls(line) and "\n" not in line
        done = bash(line, cwd=work)
        assert done.returncode == 0, (name, line, done.stderr)
        assert sorted(os.listdir(os.fsencode(work))) == [name]
        assert Path(os.fsdecode(dst)).read_bytes() == b"keep"
        subprocess.run(["rm", "-rf", "--", str(work)], check=True)


def test_an_interactive_paste_expands_no_history(tmp_path: Path) -> None:
    """A person pastes into an interactive bash, where '!' is history expansion."""
    names = [b"a!b", b"!!", b"x\n!-1", b"it's!", b"\xff!x"]
    script = b"".join(b"printf '%s\\0' " + quote(n).encode() + b"\n" for n in names)
    done = subprocess.run(["bash", "--norc", "--noprofile", "-i"], input=script,
                          capture_output=True, cwd=tmp_path, check=False,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PS1": ""})
    assert done.stdout == b"".join(n + b"\0" for n in names), done.stderr


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=12).filter(lambda b: b"\0" not in b),
                max_size=20))
def test_any_bytes_round_trip(raws: list[bytes]) -> None:
    script = printf_script(list(raws))
    assert not controls(script.replace("\n", ""))
    assert bash(script).stdout.split(b"\0")[:-1] == raws


SHOWN = [
    ("plain text", "plain text"),
    ("a\nb", "a\\nb"),
    ("a\rb", "a\\rb"),
    ("\x1b]0;title\x07", "\\e]0;title\\x07"),
    ("\x1b[2J", "\\e[2J"),
    ("\x7f\x9b", "\\x7f\\x9b"),
    ("back\\slash", "back\\\\slash"),
    (b"caf\xe9", "caf\\xe9"),
    (b"caf\xc3\xa9", "café"),
    (os.fsdecode(b"\xff"), "\\xff"),
    ("\u202eevil", "\\u202eevil"),
    ("tab\there", "tab\\there"),
]


@pytest.mark.parametrize(("text", "want"), SHOWN)
def test_shown(text: str | bytes, want: str) -> None:
    assert shown(text) == want
    assert not controls(shown(text))
