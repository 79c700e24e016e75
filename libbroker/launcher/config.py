"""The launcher's configuration: a TOML file over built-in defaults.

The file is optional (``~/.config/agent-sandbox/config.toml`` by default);
every key has a default, and a key this module does not know is an error that
names it, so a typo can never silently widen or narrow a session.

The module is pure (:func:`from_mapping` takes the decoded TOML and the few
facts about the host it needs, :class:`HostFacts`), so the rules are tested
without files or processes; reading the file, gathering the facts and asking
git are :mod:`.config_file`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from libbroker.errors import ConfigError
from libbroker.launcher import egress_values, exported_keys, grants
from libbroker.launcher.egress_values import Secret
from libbroker.launcher.git_answers import Located, default_workdir, outside_git_dirs
from libbroker.launcher.origins import Origins
from libbroker.named_tuple import NamedTuple
from libbroker.paths import under
from libbroker.sandbox.kinds import AUTO, not_a_kind
from libbroker.sandbox.limits import Limits, LimitsError
from libbroker.sandbox.limits import from_mapping as limits_from_mapping

if TYPE_CHECKING:
    from libpolicy.hostrun import Table

# GitHub's hosts (git, API, release and raw downloads) and the agent's own API.
DEFAULT_DOMAINS = (
    "github.com",
    "api.github.com",
    "codeload.github.com",
    "uploads.github.com",
    "*.githubusercontent.com",
    "api.anthropic.com",
)
DEFAULT_INJECT = ("github.com", "api.github.com")
# git's identity is read-only.  Nothing of home is writable by default: an
# agent's own config (~/.claude, ~/.codex, ~/.gemini) reaches a session as a
# private copy (libbroker.launcher.agent_home), never the real files, where
# a planted hook or MCP server would run on the host later.
DEFAULT_READ = ("~/.gitconfig", "~/.config/git")
DEFAULT_WRITE: tuple[str, ...] = ()
HARNESS = "~/.claude"
# Names a session must never carry in, whatever the config says: a phantom
# GitHub token would shadow real logins, NONO_* would rewrite nono's policy,
# AGENT_SANDBOX* is the launcher's own to set.
FORBIDDEN_ENV_PREFIXES = ("NONO_", "AGENT_SANDBOX")
FORBIDDEN_ENV = frozenset({"GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN", "LD_PRELOAD"})
# What a [[secret]]'s `env` variable holds inside the sandbox: a documented
# non-secret word, so SDKs that require the variable start; the proxy sets the
# real value on the way out.
SECRET_PLACEHOLDER = "agent-sandbox-placeholder"  # noqa: S105 - a fixed word, no secret
class HostFacts(NamedTuple):
    """What the defaults depend on, gathered once (see :func:`host_facts`)."""

    home: str
    cwd: str
    gh_present: bool
    # The repository git finds from where the session starts (the cwd, or the
    # workdir named): filled in by config_file.load, which asks git; None outside any.
    repo: Located | None = None
    # How a path's links resolve on this host (the grants' check sees through
    # links): the host's answer, brought in like the rest, so this module reads
    # nothing itself.
    realpath: Callable[[str], str] = os.path.realpath


class Config(NamedTuple):
    """One session's settings, every path absolute and every value checked."""

    workdir: str
    workdir_why: str = ""  # how the workdir was chosen (doctor says it)
    git_dirs: tuple[str, ...] = ()  # the workdir repository's git dirs outside it, granted too
    sandbox: str = AUTO
    domains: tuple[str, ...] = DEFAULT_DOMAINS
    inject: tuple[str, ...] = DEFAULT_INJECT
    token_command: str = ""
    token_every: int = 300
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    sign_key: str | None = None  # None: the key git would use in the workdir (resolve_sign_key)
    sign_from: str = ""  # where the sign key was set (doctor says it)
    sign_problem: str = ""  # why git would sign with a key no session can enable
    kubeconfig: str = ""
    env: tuple[str, ...] = ()
    resolve: tuple[str, ...] = ()
    upstream_ca: str = ""
    allow_cidr: tuple[str, ...] = ()
    start_timeout: float = 10.0
    protect_git: bool = True  # .git/hooks and .git/config read-only (bwrap)
    log_file: str = ""  # "": stderr, or the state dir's session.log when stderr is a tty
    home: str = "/"
    harness: str = ""
    agent: str = ""  # "": from the command's basename (libbroker.launcher.agents)
    agent_write_back: tuple[str, ...] = ()  # "AGENT:KEY" opted in to come back
    agents: tuple[tuple[str, Any], ...] = ()  # [agents.NAME] profiles: (name, Profile)
    hostrun_add: tuple[str, ...] = ()  # host-run files beyond libpolicy.hostrun's list
    hostrun_allow: tuple[str, ...] = ()  # rule ids, patterns or workdir paths not held
    limits: Limits = Limits()  # the session's, and each brokered command's
    secrets: tuple[Secret, ...] = ()  # [[secret]] tables
    repos: tuple[str, ...] = ()  # egress-proxy --repos: the token's writes held to these
    record: bool = True  # the session record (libbroker.launcher.record)
    unsafe_login_switch: bool = False  # a login made inside may replace another account's
    learn: bool = False  # run --learn: every public host passed and marked (not a file key)
    workdir_read_only: bool = False  # codex -s read-only (launcher.agent_argv; not a file key)


_KEYS = frozenset(
    {
        "workdir",
        "sandbox",
        "domains",
        "inject",
        "token_command",
        "token_every",
        "read",
        "write",
        "deny",
        "sign_key",
        "kubeconfig",
        "env",
        "resolve",
        "upstream_ca",
        "allow_cidr",
        "start_timeout",
        "log_file",
        "protect_git",
        "hostrun_add",
        "hostrun_allow",
        "agent",
        "agent_write_back",
        "agents",
        "limits",
        "secret",
        "repos",
        "record",
        "unsafe_grants",
        "unsafe_env",
        "unsafe_login_switch",
    }
)


def from_mapping(
    data: Mapping[str, Any], facts: HostFacts, *, origins: Origins | None = None
) -> Config:
    """Check ``data`` (decoded TOML) and fill in the defaults.

    Every refusal is a ConfigError ``{origin}: {problem}``, the origin from
    ``origins`` (by default, the key's name).
    """
    where = origins or Origins(frozenset(data))
    _known_keys(data, where)
    get = _Getter(data, where)

    def path(p: str, key: str) -> str:
        return _abs_path(p, facts, where=where(key), key=key)

    workdir, why, git_dirs = _workdir(data, get, facts, where, path)
    sandbox = _sandbox(get.string("sandbox", AUTO), where("sandbox"))
    domains, inject, secrets = _egress_hosts(data, get, where)
    token_every, env, timeout = _timing_and_env(get, where)
    read, write = _grants(get, facts, where, path)
    extra, write_back = _agents(data, get, where)
    kube, log, ca = (get.string(key, "") for key in ("kubeconfig", "log_file", "upstream_ca"))
    token_default = "gh auth token" if facts.gh_present else ""
    return Config(
        workdir=workdir,
        workdir_why=why,
        git_dirs=git_dirs,
        sandbox=sandbox,
        domains=domains,
        inject=inject,
        token_command=egress_values.command(
            get.string("token_command", token_default).strip(), where("token_command")),
        token_every=token_every,
        read=read,
        write=write,
        deny=tuple(path(p, "deny") for p in get.strings("deny", ())),
        sign_key=get.string("sign_key", "").strip() if "sign_key" in data else None,
        kubeconfig=path(kube, "kubeconfig") if kube else "",
        env=env,
        resolve=egress_values.resolve(get.strings("resolve", ()), where("resolve")),
        upstream_ca=path(ca, "upstream_ca") if ca else "",
        allow_cidr=egress_values.cidrs(get.strings("allow_cidr", ()), where("allow_cidr")),
        start_timeout=timeout,
        log_file=path(log, "log_file") if log else "",
        protect_git=get.boolean("protect_git", True),
        agent=_agent(get.string("agent", ""), extra, where("agent")),
        agent_write_back=write_back,
        agents=extra,
        hostrun_add=_hostrun(get.strings("hostrun_add", ()), where("hostrun_add"), "hostrun_add"),
        hostrun_allow=_hostrun_allow(get.strings("hostrun_allow", ()), where("hostrun_allow")),
        limits=_limits(data.get("limits", {}), where),
        secrets=secrets,
        repos=egress_values.repos(get.strings("repos", ()), where("repos")),
        record=get.boolean("record", True),
        unsafe_login_switch=get.boolean("unsafe_login_switch", False),
        home=facts.home,
        harness=path(HARNESS, "harness"),
    )


def _sandbox(kind: str, where: str) -> str:
    """The backend the config names (or auto), refused unless it is one."""
    problem = not_a_kind(kind)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return kind


def _known_keys(data: Mapping[str, Any], where: Origins) -> None:
    for key in data:
        if key not in _KEYS:
            raise ConfigError(f"{where.place(key)}unknown key {key!r} "
                              f"(known: {', '.join(sorted(_KEYS))})")


def _grants(get: _Getter, facts: HostFacts, where: Origins,
            path: Callable[[str, str], str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """read and write; ConfigError for a grant that reopens a shut home path, unless accepted."""
    read = tuple(path(p, "read") for p in get.strings("read", DEFAULT_READ))
    write = tuple(path(p, "write") for p in get.strings("write", DEFAULT_WRITE))
    unsafe = tuple(path(p, "unsafe_grants") for p in get.strings("unsafe_grants", ()))
    grants.check(read, write, unsafe, facts.home, where, facts.realpath)
    return read, write


def _workdir(data: Mapping[str, Any], get: _Getter, facts: HostFacts, where: Origins,
             path: Callable[[str, str], str]) -> tuple[str, str, tuple[str, ...]]:
    """The workdir, why it is that one, and its repository's git dirs outside it."""
    if "workdir" in data:
        workdir = path(get.string("workdir", ""), "workdir")
        why = f"named by {where('workdir')}"
    else:  # the repository holding the cwd, where there is one
        workdir, why = default_workdir(facts.cwd, facts.home, facts.repo)
    if under(facts.home, workdir):
        # A writable home (or /) would hand the sandbox every credential file.
        raise ConfigError(f"{where('workdir')}: {workdir} contains the home directory "
                          f"{facts.home}; name a project directory")
    try:
        git_dirs = outside_git_dirs(facts.repo, workdir, facts.home)
    except ValueError as exc:
        raise ConfigError(f"{where('workdir')}: {exc}") from None
    return workdir, why, git_dirs


def _egress_hosts(data: Mapping[str, Any], get: _Getter,
                  where: Origins) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Secret, ...]]:
    """The allowed domains, the inject hosts and the secrets, by egress-proxy's rules."""
    domains = egress_values.domains(get.strings("domains", DEFAULT_DOMAINS), where("domains"))
    inject = egress_values.hosts(get.strings("inject", DEFAULT_INJECT), where("inject"))
    secrets = egress_values.secrets(data.get("secret", []), where.secret, inject,
                                    _check_env_name, where("secret"))
    # A secret's host is allowed (egress-proxy intercepts it) and named in the policy.
    domains += tuple(s.host for s in secrets if s.host not in domains)
    return domains, inject, secrets


def _timing_and_env(get: _Getter, where: Origins) -> tuple[int, tuple[str, ...], float]:
    """token_every, the variables passed in (none that carries a key unasked), start_timeout."""
    token_every = get.integer("token_every", 300)
    if not 0 < token_every < 10**7:
        raise ConfigError(f"{where('token_every')}: must be at least 1 second (and under 10**7)")
    env = get.strings("env", ())
    for name in env:
        _check_env_name(name, f"{where('env')}: entry")
    exported_keys.check_env(env, get.strings(exported_keys.UNSAFE_KEY, ()), where("env"))
    timeout = get.number("start_timeout", 10.0)
    if not 0 < timeout <= 300:
        raise ConfigError(f"{where('start_timeout')}: must be in (0, 300] seconds")
    return token_every, env, timeout


class _Getter:
    """Typed reads of a TOML mapping with messages naming where the value came from."""

    def __init__(self, data: Mapping[str, Any], where: Origins) -> None:
        self._data = data
        self._where = where

    def _bad(self, key: str, want: str) -> ConfigError:
        return ConfigError(f"{self._where(key)}: must be {want}")

    def string(self, key: str, default: str) -> str:
        value = self._data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        if "\0" in value:
            raise self._bad(key, "a string without NUL bytes")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._data.get(key, default)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings")
        if any("\0" in v or not v.strip() for v in value):
            raise self._bad(key, "a list of non-empty strings")
        return tuple(v.strip() for v in value)

    def integer(self, key: str, default: int) -> int:
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._data.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def number(self, key: str, default: float) -> float:
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, "a number")
        return float(value)


def _abs_path(p: str, facts: HostFacts, *, where: str, key: str) -> str:
    if p == "~" or p.startswith("~/"):
        p = facts.home + p[1:]
    elif not os.path.isabs(p):
        if key != "workdir":
            raise ConfigError(f"{where}: path {p!r} must be absolute or start with ~/")
        p = os.path.join(facts.cwd, p)
    return os.path.normpath(p)


def _hostrun(values: tuple[str, ...], where: str, key: str) -> tuple[str, ...]:
    from libpolicy.hostrun import HostRunError, check_pattern

    try:
        return tuple(check_pattern(v, key) for v in values)
    except HostRunError as exc:
        raise ConfigError(f"{where}: {str(exc).removeprefix(key + ' ')}") from None


def _hostrun_allow(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``hostrun_allow``: rule ids, built-in patterns, or workdir paths of host-run files.

    A path that no entry matches turns nothing off: it is a typo (or a rule
    id misspelled), and a silent one would leave the person believing a file
    is let go.  A directory's own host-run files are let go by naming the
    files (``sub/.envrc``) or the entry (``envrc``).
    """
    from libpolicy.hostrun import ENTRIES, RULES, Table

    checked = _hostrun(values, where, "hostrun_allow")
    patterns = {e.pattern for e in ENTRIES}
    table = Table()
    for value in checked:
        if value in RULES or value in patterns or table.match(value) is not None:
            continue
        raise ConfigError(
            f"{where}: entry {value!r} turns nothing off: give a rule id "
            f"({', '.join(sorted(RULES))}), one of their patterns, or the workdir path "
            "of a host-run file (sub/.envrc)"
        )
    return checked


def hostrun_table(cfg: Config) -> Table:
    """The host-run list in effect for ``cfg`` (libpolicy.hostrun), rooted at the workdir."""
    from libpolicy.hostrun import Table

    return Table(cfg.hostrun_add, cfg.hostrun_allow, cfg.workdir)


def _limits(table: Any, where: Origins) -> Limits:
    """``limits = {tasks = 4096, memory = "8G", tmp = "2G", cpu = 2, timeout = "10m"}``."""
    if isinstance(table, Mapping):
        for name, value in table.items():  # each value checked alone: its own line
            try:
                limits_from_mapping({name: value}, "limits")
            except LimitsError as exc:
                reason = _limit_reason(exc).removeprefix(f"{name} ")
                raise ConfigError(f"{where('limits', str(name))}: {reason}") from None
    try:
        return limits_from_mapping(dict(table) if isinstance(table, Mapping) else table, "limits")
    except LimitsError as exc:
        raise ConfigError(f"{where('limits')}: {_limit_reason(exc)}") from None


def _limit_reason(exc: LimitsError) -> str:
    return str(exc).removeprefix("limits: ").removeprefix("limits ")


def _agents(
    data: Mapping[str, Any], get: _Getter, where: Origins
) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The config's own agent profiles and write-back opt-ins (libbroker.launcher.agents)."""
    tables = data.get("agents", {})
    if not isinstance(tables, Mapping) or not all(isinstance(t, Mapping) for t in tables.values()):
        raise ConfigError(f"{where('agents')}: must be a table of [agents.NAME] tables")
    write_back = get.strings("agent_write_back", ())
    if not tables and not write_back:
        return (), ()
    from libbroker.launcher import agents

    extra = {name: agents.from_config(name, t, where("agents", name)) for name, t in tables.items()}
    for name, profile in extra.items():  # a session adds them to egress-proxy's --allow
        egress_values.domains(profile.domains, f"{where('agents', name)}.domains")
    agents.check_write_back(write_back, extra, where("agent_write_back"))
    return tuple(extra.items()), write_back


def _agent(name: str, extra: tuple[tuple[str, Any], ...], where: str) -> str:
    """``agent`` (or --agent): a known profile, one of the config's, or none."""
    if not name:
        return name
    from libbroker.launcher import agents

    known = {*agents.PROFILES, *dict(extra)}
    if name not in known and name != agents.NONE:
        raise ConfigError(f"{where}: unknown agent {name!r} (known: {', '.join(sorted(known))}, "
                          f"or {agents.NONE})")
    return name


def _check_env_name(name: str, where: str) -> None:
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise ConfigError(f"{where} {name!r} is not a variable name")
    if name in FORBIDDEN_ENV or name.startswith(FORBIDDEN_ENV_PREFIXES):
        raise ConfigError(f"{where} {name!r} may not be passed into a session")
