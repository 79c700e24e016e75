"""The servers' early start: which command lines get it, and the deferred boot's arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from libbroker.launcher import boot, install, prestart


def test_only_run_starts_the_servers_early() -> None:
    assert prestart.wants_servers(["run", "--", "true"])
    assert prestart.wants_servers(["--config=x.toml", "run", "true"])
    assert prestart.wants_servers(["--config", "run.toml", "run", "--", "run"])
    assert not prestart.wants_servers(["--config", "run", "doctor"])
    assert not prestart.wants_servers(["doctor"])
    assert not prestart.wants_servers(["render-settings", "--", "run"])
    assert not prestart.wants_servers(["--version"])
    assert not prestart.wants_servers([])


def _boot(tmp_path: Path, warm: tuple[str, ...] = ()) -> list[str]:
    (tmp_path / "fake_server.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    print(json.dumps([sys.argv, os.read(0, 10).decode(), sorted(sys.modules)]))\n"
        "    return 3\n"
    )
    code = boot._BOOT_DEFERRED.format(
        paths=[str(tmp_path)],
        name="fake-server",
        module="fake_server",
        warm=warm,
        fallback=["/bin/false"],
    )
    return [sys.executable, "-I", "-S", "-c", code]


def _run_boot(tmp_path: Path, stdin: bytes, warm: tuple[str, ...] = ()) -> tuple[int, str]:
    done = subprocess.run(
        _boot(tmp_path, warm), input=stdin, capture_output=True, timeout=60, check=False
    )
    assert done.stderr == b""
    return done.returncode, done.stdout.decode()


def test_the_deferred_boot_gets_exactly_the_arguments(tmp_path: Path) -> None:
    import json

    args = ["--listen=127.0.0.1:0", "", "with space", "x=y\nz", "ünï"]
    code, out = _run_boot(tmp_path, boot.encode_args(args), warm=("json", "no_such_module"))
    assert code == 3
    argv, stdin_after, modules = json.loads(out)
    assert argv == ["fake-server", *args]
    assert stdin_after == ""  # stdin is /dev/null once the arguments are read
    assert "json" in modules


def test_no_arguments_is_an_empty_list(tmp_path: Path) -> None:
    import json

    code, out = _run_boot(tmp_path, boot.encode_args([]))
    assert code == 3 and json.loads(out)[0] == ["fake-server"]


def test_end_of_file_before_the_arguments_exits_quietly(tmp_path: Path) -> None:
    for partial in (b"", b"--listen=1\0", boot.encode_args(["a"])[:-1]):
        assert _run_boot(tmp_path, partial) == (0, "")


@given(st.lists(st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]))))
def test_encoded_arguments_decode_back(args: list[str]) -> None:
    data = boot.encode_args(args)
    assert data.endswith(b"\n")
    import os

    assert [os.fsdecode(a) for a in data[:-1].split(b"\0")[:-1]] == args


_WORDS = [
    "run", "doctor", "render-settings", "--", "--config=a.toml", "--config", "--conf=b",
    "--workdir=/w", "--workdir=", "--sandbox=bwrap", "--sandbox=nono", "--sandbox",
    "true", "sh", "-c", "-h", "--help", "--version", "--bogus", "", "x y",
    "--agent=codex", "--agent", "--agent=", "codex",
    "--limit=memory=1G", "--limit=tasks=64", "--limit", "--limit=", "tasks=64", "--lim=cpu=1",
    "--learn", "--lea", "report", "watch", "--json", "--last", "--list", "--verify",
]


def _docopt(argv: list[str]) -> dict[str, object] | None:
    import bin.agent_sandbox
    from libbroker.cli import parse

    try:
        return parse(bin.agent_sandbox.__doc__ or "", argv)
    except SystemExit:
        return None


@given(st.lists(st.sampled_from(_WORDS), max_size=8))
def test_run_args_is_docopt_or_nothing(argv: list[str]) -> None:
    quick = prestart.run_args(argv)
    if quick is not None:
        assert quick == _docopt(argv)


def test_run_args_reads_the_usual_command_lines() -> None:
    for argv in (
        ["run", "--", "true"],
        ["run", "--config=/c.toml", "--sandbox=bwrap", "--", "sh", "-c", "exit 3"],
        ["--workdir=/w", "run", "--config=c", "--", "--config=x", "--"],
        ["run", "--agent=codex", "--sandbox=nono", "--", "my-codex", "exec", "hi"],
        ["run", "--limit=memory=1G", "--limit=tasks=64", "--", "make"],
        ["run", "--learn", "--sandbox=bwrap", "--", "make"],
    ):
        assert prestart.run_args(argv) is not None
        assert prestart.run_args(argv) == _docopt(argv)
    for argv in (["run", "true"], ["run", "--conf=x", "--", "true"], ["run", "--"]):
        assert prestart.run_args(argv) is None


def test_scripts_dir_agrees_with_sysconfig() -> None:
    import sysconfig

    assert install.scripts_dir() == sysconfig.get_path("scripts")
