"""The one place a session's settings are checked: flags, the file, the defaults, the host.

``agent-sandbox run``, ``doctor`` and ``render-settings`` all come through
:func:`from_args`, before any server gets its arguments.  Every refusal is a
UsageError (exit 2) of one line, ``{origin}: {problem}``, where the origin is
what to edit: the flag (``--limit``), the file's line (``/home/u/.config/
agent-sandbox/config.toml line 7: domains``), the ``[[secret]]`` table
(``[[secret]] #2 (api.anthropic.com)``) or the default (``workdir (default:
the current directory)``); see :mod:`.origins`.  What egress-proxy would
refuse at start is refused here first, by its own rules (:mod:`.egress_values`).

The pure part is :func:`.config.from_mapping`; this module reads the file
and then looks at the host for what only the host can say: its facts
(:func:`host_facts`), where git finds the repository and which key git would
sign with (:mod:`.gitfacts`), is the workdir a directory, is ``upstream_ca`` a
file of certificates.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from libbroker.errors import ConfigError, UsageError
from libbroker.launcher import gitfacts
from libbroker.launcher.config import Config, HostFacts, from_mapping
from libbroker.launcher.git_answers import parse_signing
from libbroker.launcher.here import here
from libbroker.launcher.origins import Origins, key_lines, toml_error, utf8_error
from libbroker.sandbox.limits import LimitsError, parse_flags
from libbroker.sandbox.limits import from_mapping as limits_from_mapping
from libbroker.which import which

if TYPE_CHECKING:
    from libbroker.launcher.child import Proc

# The command line's options, by the config key each one sets.
FLAGS = {"workdir": "--workdir", "sandbox": "--sandbox", "agent": "--agent", "limits": "--limit"}
_MAX_FILE = 1 << 20


def from_args(args: Mapping[str, Any], *, check_host: bool = True) -> Config:
    """The session's config from docopt's ``args``; UsageError (exit 2) naming the origin.

    ``check_host=False`` (doctor): the host's side is what doctor reports on,
    one check at a time, instead of stopping at the first.
    """
    overrides: dict[str, Any] = {key: args.get(flag) for key, flag in FLAGS.items()
                                 if key != "limits"}
    path = args.get("--config")
    try:
        if args.get("--limit"):
            overrides["limits"] = _limit_flags(list(args["--limit"]))
        return load(os.path.expanduser(path) if path else None, host_facts(),
                    overrides=overrides, check_host=check_host)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _limit_flags(flags: list[str]) -> dict[str, str]:
    """``--limit NAME=VALUE`` flags, each value checked alone (its origin is the flag)."""
    try:
        values = parse_flags(flags)
        for name, value in values.items():
            limits_from_mapping({name: value}, "--limit")
    except LimitsError as exc:
        text = str(exc).removeprefix("--limit: ").removeprefix("--limit ")
        raise ConfigError(f"--limit: {text}") from None
    return values


def default_path(home: str) -> str:
    """Where the config lives when ``--config`` is not given."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return os.path.join(base, "agent-sandbox", "config.toml")


def host_facts() -> HostFacts:
    """Look at the host once: home, cwd, gh on PATH."""
    home = os.path.expanduser("~")
    return HostFacts(home=home, cwd=here(), gh_present=which("gh") is not None)


def resolve_sign_key(cfg: Config) -> Config:
    """``cfg`` with its sign key decided: the config's, else the one git would use there.

    Separate from loading because it runs git: the launcher does it while the
    proxy starts, not before (:func:`ask_sign_key`, then :func:`take_sign_key`).
    """
    return take_sign_key(cfg, ask_sign_key(cfg))


def ask_sign_key(cfg: Config) -> Proc | None:
    """Ask git for its signing settings in the workdir, when the config names no key."""
    if cfg.sign_key is not None:
        return None
    return gitfacts.start_signing(cfg.workdir, cfg.home)


def take_sign_key(cfg: Config, git: Proc | None) -> Config:
    """``cfg`` with the key git would use in the workdir (from :func:`ask_sign_key`), if any."""
    if cfg.sign_key is not None:
        if cfg.sign_from:
            return cfg
        return cfg._replace(sign_from="the config's sign_key" if cfg.sign_key else "")
    if git is None:  # no git here: nothing to sign for
        return cfg._replace(sign_key="")
    status, out = gitfacts.collect(git)
    found = parse_signing(status, out, cfg.workdir)
    return cfg._replace(sign_key=found.key, sign_from=found.origin, sign_problem=found.problem)


def load(
    path: str | None, facts: HostFacts, *, overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None, check_host: bool = True,
) -> Config:
    """The file at ``path`` (else the default, which may be absent) under ``overrides``.

    git is asked where the repository is (:mod:`.gitfacts`) while the file is
    read: from ``--workdir``, else from the cwd, which a workdir in the file
    then overrides (and is asked about instead).
    """
    file = os.path.abspath(path) if path is not None else default_path(facts.home)
    flag = (overrides or {}).get("workdir")
    guess = gitfacts.start_dir(facts.cwd if flag is None else flag, facts.cwd, facts.home)
    asked = gitfacts.take_early(guess)  # asked while the servers started (prestart)
    if asked is None and guess:
        asked = gitfacts.start_locate(guess, facts.home)
    try:
        text = _read(file, explicit=path is not None)
        data = _parse(file, text)
    except ConfigError:
        gitfacts.discard(asked)
        raise
    merged = dict(data)
    named: dict[str, str] = {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "limits" and isinstance(merged.get(key), dict):
            value = {**merged[key], **value}  # --limit flags over the file's table
        else:  # the flag's value is checked under the flag's name
            named[key] = (flags or FLAGS).get(key, key)
        merged[key] = value
    where = gitfacts.start_dir(merged.get("workdir", facts.cwd), facts.cwd, facts.home)
    if where != guess:  # the file names the workdir: ask about that one
        gitfacts.discard(asked)
        asked = gitfacts.start_locate(where, facts.home) if where else None
    facts = facts._replace(repo=gitfacts.located(asked))
    origins = Origins(frozenset(data), file=file, lines=key_lines(text), flags=named)
    cfg = from_mapping(merged, facts, origins=origins)
    if check_host:
        _check_host(cfg, origins)
    return cfg


def _read(file: str, *, explicit: bool) -> str:
    """The file's text; "" for an absent default file.  Messages name the file."""
    label = "--config" if explicit else f"{file} (the default config file)"
    try:
        with open(file, "rb") as fh:
            raw = fh.read(_MAX_FILE + 1)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"--config: {file} does not exist") from None
        return ""
    except OSError as exc:
        shown = f"{file} cannot be read" if explicit else "cannot be read"
        raise ConfigError(f"{label}: {shown}: {exc.strerror or exc}") from None
    if len(raw) > _MAX_FILE:
        raise ConfigError(f"{file}: larger than 1 MiB; not a config file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(utf8_error(file, raw, exc)) from None


def _parse(file: str, text: str) -> dict[str, Any]:
    if not text:  # no file (the default's absent): tomllib is not imported
        return {}
    import tomllib  # only when a file is read: ~4.5 ms of CPU (datetime, string, 4 regexes)

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(toml_error(file, str(exc))) from None


def _check_host(cfg: Config, where: Origins) -> None:
    """What only the host can say: the workdir exists, ``upstream_ca`` holds certificates."""
    if not os.path.isdir(cfg.workdir):
        raise ConfigError(f"{where('workdir')}: {cfg.workdir} is not a directory")
    if cfg.upstream_ca:
        _check_ca(cfg.upstream_ca, where("upstream_ca"))
    if cfg.kubeconfig and not os.path.isfile(cfg.kubeconfig):
        raise ConfigError(f"{where('kubeconfig')}: {cfg.kubeconfig} is not a file")
    _check_landlock_deny(cfg, where)


def _check_landlock_deny(cfg: Config, where: Origins) -> None:
    """Landlock grants a tree whole: a ``deny`` inside a granted tree cannot hold.

    The sandbox refuses it when it starts (:func:`libbroker.sandbox.landlock.ruleset`);
    the same rule over the session's grants, here, names the key instead.
    """
    from libbroker.launcher.install import host_facts as install_facts
    from libbroker.paths import under
    from libbroker.sandbox.kinds import AUTO, choose_backend, denies_inside_grants
    from libbroker.sandbox.shape import DEVICES, SYSTEM_READ, TERMINAL_DEVICES

    if not cfg.deny:
        return
    backend = choose_backend(cfg.sandbox)
    if denies_inside_grants(backend):
        return
    host = install_facts(cfg.workdir)
    grants = (*SYSTEM_READ, "/proc", *host.python_dirs, host.project_dir, *cfg.read,
              *DEVICES, *TERMINAL_DEVICES, *cfg.write, cfg.workdir)
    for deny in cfg.deny:
        if not os.path.exists(deny):
            continue
        for grant in grants:
            if under(deny, grant) and not any(under(grant, d) for d in cfg.deny):
                how = f"--sandbox={backend}" if cfg.sandbox != AUTO else "auto (no bwrap here)"
                raise ConfigError(
                    f"{where('deny')}: {deny} is inside the granted {grant}, and Landlock "
                    f"({how}) cannot deny part of a grant; use --sandbox=bwrap"
                )


def _check_ca(path: str, where: str) -> None:
    """egress-proxy loads the file as its upstream roots at start: load it the same way now."""
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file {path}")
    # egress-proxy's load (ssl.create_default_context(cafile=path)) is this OpenSSL
    # call on a client context: made here on _ssl's own context, without the ssl
    # module (~8 ms of CPU on the start's critical path: its enums, for one check).
    import _ssl  # only when the config names a CA file

    try:
        _ssl._SSLContext(_ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(path)
    except (_ssl.SSLError, OSError, ValueError):
        raise ConfigError(f"{where}: {path} holds no PEM certificate egress-proxy can load") \
            from None
