"""Every README example runs, or at least parses: a README example that fails is a failing test.

- Each ```toml block (of the README and of docs/) goes through the launcher's own
  config loader, the one ``agent-sandbox run --config=FILE`` uses: it must parse
  and be accepted.
- Each command line (```sh blocks, and indented blocks, taken as shell) must be
  valid bash; each call of one of our executables in it must be accepted by
  that executable's own docopt usage; each ``just`` call must name recipes the
  Justfile has (``just --dry-run``).
- The commands that can run here without an agent, a login or a terminal
  (``agent-sandbox doctor``, ``report``, ``render-settings``, ``run -- true``,
  ``--help``) do run, as a user would paste them, in a home of their own; and the
  Quick start's main job, ``just demo``, runs a real session.
- The Quick start is one ```sh block of exactly two lines (``.ci/run`` runs line 2).

A README block in any other language fails too, so no example escapes the test.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import docopt
import pytest

from libbroker.errors import ConfigError
from libbroker.launcher import config, config_file

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Our console scripts whose usage is docopt's: the module whose __doc__ is it.
DOCOPT_SCRIPTS = {
    "agent-sandbox": "bin.agent_sandbox",
    "broker-server": "bin.broker_server",
    "broker-client": "bin.broker_client",
    "egress-proxy": "bin.egress_proxy",
    "policy-hook": "bin.policy_hook",
    "kubeconfig-proxify": "bin.kubeconfig_proxify",
}
# agent-sandbox subcommands that run here as pasted: no agent, no login, no tty.
RUNNABLE = ("doctor", "report", "render-settings", "--help", "-h", "--version")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", "(", ")", ";;", "|&"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&", "&>", ">|"}


class Block(NamedTuple):
    lang: str  # "toml", "sh", ...; "indented" for a 4-space block
    text: str
    where: str  # file:line, for the test's id and messages


def blocks(path: Path) -> list[Block]:
    """The fenced and indented code blocks of a Markdown file."""
    return parse_blocks(path.read_text(), path.name)


def parse_blocks(text: str, name: str) -> list[Block]:
    """The fenced and indented code blocks of Markdown ``text``."""
    found: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if fence:
            end = lines.index("```", i + 1)
            found.append(Block(fence.group(1), "\n".join(lines[i + 1 : end]) + "\n",
                               f"{name}:{i + 1}"))
            i = end + 1
            continue
        starts_indented = lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip())
        if starts_indented and not lines[i].lstrip().startswith(("-", "*", "|")):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            text = "\n".join(ln[4:] for ln in lines[i:j]).strip("\n") + "\n"
            found.append(Block("indented", text, f"{name}:{i + 1}"))
            i = j
            continue
        i += 1
    return found


def _readme() -> list[Block]:
    return blocks(README)


def toml_blocks() -> list[Block]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [b for p in [README, *docs] for b in blocks(p) if b.lang == "toml"]


def command_lines() -> list[tuple[str, str]]:
    """(where, line) for every command line of the README's shell blocks."""
    out = []
    for b in _readme():
        if b.lang in ("sh", "indented"):
            for n, line in enumerate(b.text.splitlines()):
                if line.strip() and not line.lstrip().startswith("#"):
                    out.append((f"{b.where}+{n + 1}", line))
    return out


def simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line, assignments before them dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    tokens = [*lex, ";"]
    words: list[str] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:  # a redirection's target
            skip = False
        elif token in REDIRECTIONS:
            skip = True
        elif token.isdigit() and tokens[i + 1] in REDIRECTIONS:
            pass  # the fd number of `2>file`
        elif token in SHELL_OPERATORS:
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)
            if words:
                yield words
            words = []
        else:
            words.append(token)


def test_every_readme_block_is_tested() -> None:
    langs = {b.lang for b in _readme()}
    assert langs <= {"sh", "toml", "indented"}, f"untested block kinds: {langs}"
    assert any(b.lang == "toml" for b in _readme()), "the README has a complete config example"


def test_quick_start_is_one_block_of_two_lines() -> None:
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    first = parse_blocks(section, "README.md")[0]
    assert first.lang == "sh"
    assert len(first.text.splitlines()) == 2, first.text
    run = (ROOT / ".ci" / "run").read_text()
    assert "n==2" in run, ".ci/run reads line 2 of this block"


def facts(tmp_path: Path) -> config.HostFacts:
    home = tmp_path / "home"
    (home / "src" / "project").mkdir(parents=True)
    return config.HostFacts(home=str(home), cwd=str(home / "src" / "project"), gh_present=False)


@pytest.mark.parametrize("block", toml_blocks(), ids=lambda b: b.where)
def test_toml_example_is_accepted_by_the_launcher(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(block.text)
    cfg = config_file.load(str(path), facts(tmp_path), check_host=False)
    assert cfg.workdir


def _docopt_accepts(program: str, argv: list[str]) -> None:
    doc = importlib.import_module(DOCOPT_SCRIPTS[program]).__doc__ or ""
    try:
        docopt.docopt(doc, argv=argv, default_help=False, version=None)
    except docopt.DocoptExit as exc:
        pytest.fail(f"{program} {shlex.join(argv)}: usage not accepted: {exc}")


def _just_accepts(argv: list[str]) -> None:
    just = shutil.which("just")
    if just is None:
        pytest.skip("just is not installed (just setup installs it into .venv)")
    done = subprocess.run([just, "--justfile", str(ROOT / "Justfile"), "--dry-run", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"just {shlex.join(argv)}: {done.stderr}"


@pytest.mark.parametrize(("where", "line"), command_lines(), ids=[w for w, _ in command_lines()])
def test_command_line_parses(where: str, line: str) -> None:
    syntax = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True,
                            check=False)
    assert syntax.returncode == 0, f"{where}: not valid bash: {syntax.stderr}"
    for words in simple_commands(line):
        program = os.path.basename(words[0])
        if program in DOCOPT_SCRIPTS:
            _docopt_accepts(program, words[1:])
        elif program == "just":
            _just_accepts(words[1:])


def _runnable_here(words: list[str]) -> bool:
    if words[0] != "agent-sandbox" or len(words) < 2:
        return False
    return words[1] in RUNNABLE or words[1:] == ["run", "--", "true"]


def _runnable() -> list[tuple[str, str]]:
    """(where, line) for the lines made only of commands that can run here."""
    return [(where, line) for where, line in command_lines()
            if all(_runnable_here(w) for w in simple_commands(line))]


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """A home of its own with one finished session in it, for report's examples."""
    root = tmp_path_factory.mktemp("readme-user")
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "AGENT_SANDBOX"))}
    env.update(HOME=str(home), NO_COLOR="1")
    first = subprocess.run(["agent-sandbox", "run", "--", "true"], env=env, cwd=work,
                           capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, check=False)
    assert first.returncode == 0, first.stderr
    return env, work


@pytest.mark.parametrize(("where", "line"), _runnable(), ids=[w for w, _ in _runnable()])
def test_runnable_command_runs(where: str, line: str,
                               user_env: tuple[dict[str, str], Path]) -> None:
    """The line as pasted into bash, in a home of its own."""
    env, work = user_env
    done = subprocess.run(["bash", "-c", line], env=env, cwd=work, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    # doctor exits 1 when a check fails on this machine (e.g. no user namespaces);
    # every other example must succeed as pasted.
    allowed = (0, 1) if " doctor" in line else (0,)
    assert done.returncode in allowed, f"{where}: {line!r} exited {done.returncode}:\n{out}"
    if " run " not in line:  # `run -- true` prints nothing; the others say something
        assert done.stdout.strip(), f"{where}: {line!r} printed nothing"


def test_the_quick_start_demo_runs_a_session() -> None:
    """Line 1's main job: `just demo` shows what the sandbox sees."""
    just = shutil.which("just")
    if just is None:
        pytest.skip("just is not installed (just setup installs it into .venv)")
    done = subprocess.run([just, "--justfile", str(ROOT / "Justfile"), "demo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inside: AGENT_SANDBOX=1" in done.stdout
    assert "CONNECT answered 403" in done.stdout
    assert "brokered command ran" in done.stdout


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """The checks above catch what issue 25 found: keys joined with `;` are not TOML."""
    bad = tmp_path / "bad.md"
    bad.write_text('```toml\nhostrun_add = [".husky/"]; hostrun_allow = []\n```\n')
    (block,) = blocks(bad)
    path = tmp_path / "config.toml"
    path.write_text(block.text)
    with pytest.raises(ConfigError):
        config_file.load(str(path), facts(tmp_path), check_host=False)
    with pytest.raises(pytest.fail.Exception):
        _docopt_accepts("agent-sandbox", ["run"])
