"""The session's sandbox as data: its Shape, bwrap argv, environment, what it starts (pure)."""

from __future__ import annotations

import pytest

from libbroker.launcher import agent_sandbox, install, plan
from libbroker.launcher.agent_sandbox import Host
from libbroker.launcher.config import HostFacts, from_mapping
from libbroker.launcher.runtime import Runtime
from libbroker.sandbox.bwrap import Facts

FACTS = HostFacts(home="/home/u", cwd="/home/u/project", gh_present=False)
CFG = from_mapping({"read": ["~/.cargo"], "deny": ["/home/u/project/.env"]}, FACTS)
RT = Runtime("/run/user/1000/agent-sandbox/session-x")
HOST = Host(
    python="/home/u/.pyenv/versions/3.11/bin/python3.11",
    python_dirs=("/home/u/.pyenv/versions/3.11",),
    project_dir="/opt/agent-sandbox",
    forwarder="/opt/agent-sandbox/libbroker/sandbox/forwarder.py",
    bin_dir="/home/u/.pyenv/versions/3.11/bin",
    cwd="/home/u/project/sub",
)
ON_HOST = Facts(
    dirs=frozenset({"/usr", "/etc", "/home/u/.pyenv/versions/3.11", "/opt/agent-sandbox",
                    "/home/u/project", "/home/u/.cargo", RT.root}),
    files=frozenset({"/etc/shadow", "/home/u/project/.env"}),
    links={"/bin": "usr/bin", "/lib": "usr/lib"},
)  # fmt: skip


# --- bwrap -------------------------------------------------------------------


def _shape(cfg=CFG, host=HOST, tty: bool = False, landlock: bool = False):  # type: ignore[no-untyped-def]
    ports = (4000, 4001) if landlock else ()
    tmp = RT.root + "/tmp" if landlock else ""
    if landlock:
        return agent_sandbox.landlock_shape(cfg, RT, host, {"A": "b"}, tty=tty, ports=ports,
                                            tmpdir=tmp)
    return agent_sandbox.bwrap_shape(cfg, RT, host, {"A": "b"}, tty=tty, tmpdir=tmp)


def _argv(tty: bool, cfg=CFG, facts=ON_HOST) -> list[str]:  # type: ignore[no-untyped-def]
    shape = _shape(cfg, HOST, tty)
    return agent_sandbox.bwrap_argv(
        shape, RT, HOST, ["claude", "--x"], facts=facts, control_fd=4, seccomp_fd=5
    )


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_bwrap_has_no_network_no_capabilities_and_dies_with_the_launcher() -> None:
    argv = _argv(tty=False)
    assert argv[:5] == ["bwrap", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    assert "--share-net" not in argv


def test_new_session_only_without_a_tty() -> None:
    assert "--new-session" in _argv(tty=False)
    assert "--new-session" not in _argv(tty=True)
    assert _argv(tty=True)[_argv(tty=True).index("--seccomp") :][:2] == ["--seccomp", "5"]


def test_home_is_hidden_then_only_allowed_paths_come_back() -> None:
    argv = _argv(tty=False)
    home = argv.index("/home/u")
    assert argv[home - 1] == "--tmpfs"
    after = argv[home:]
    assert ("/home/u/.pyenv/versions/3.11", "/home/u/.pyenv/versions/3.11") in _pairs(
        after, "--ro-bind"
    )
    assert ("/home/u/.cargo", "/home/u/.cargo") in _pairs(after, "--ro-bind")
    assert ("/home/u/project", "/home/u/project") in _pairs(after, "--bind")
    # a grant that does not exist on the host is not bound (nor created)
    assert "/home/u/.claude" not in after
    # the deny path is masked after the workdir is bound
    assert ("/dev/null", "/home/u/project/.env") in _pairs(after, "--ro-bind")


def test_system_read_only_secrets_masked_runtime_read_only() -> None:
    argv = _argv(tty=False)
    assert ("/usr", "/usr") in _pairs(argv, "--ro-bind")
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")
    assert ("/dev/null", "/etc/shadow") in _pairs(argv, "--ro-bind")
    assert ("/dev/null", "/etc/gshadow") not in _pairs(argv, "--ro-bind")  # not on this host
    assert (RT.root, RT.root) in _pairs(argv, "--ro-bind")
    assert tuple(argv[argv.index("--chdir") :][:2]) == ("--chdir", "/home/u/project/sub")


def test_the_forwarder_wraps_the_command() -> None:
    argv = _argv(tty=False)
    tail = argv[argv.index("--", argv.index("--seccomp")) + 1 :]
    assert argv[argv.index("--seccomp") + 2] == "--"
    assert tail[:4] == [HOST.python, "-I", "-S", HOST.forwarder]
    assert tail[4:6] == ["--control", "4"] and "--listen" not in tail  # ports: the bridge's
    assert tail[-3:] == ["--", "claude", "--x"]
    assert "--own-group" in tail
    assert "--own-group" not in _argv(tty=True)


def test_the_native_forwarder_wraps_the_command_when_built() -> None:
    """libbroker/native/forwarder.c, when built, runs as itself: no interpreter to start."""
    native = "/opt/agent-sandbox/libbroker/native/forwarder"
    shape = _shape(CFG, HOST, False)
    argv = agent_sandbox.bwrap_argv(shape, RT, HOST._replace(native_forwarder=native),
                                    ["claude"], facts=ON_HOST, control_fd=4, seccomp_fd=5)
    tail = argv[argv.index("--", argv.index("--seccomp")) + 1 :]
    assert tail[:3] == [native, "--control", "4"]
    assert HOST.python not in tail and tail[-2:] == ["--", "claude"]


def test_the_forwarder_gets_the_rlimits_to_set_on_itself() -> None:
    """Under rlimits the command's parent sets them itself (a prlimit walk can miss a fork
    in flight); with cgroups, or no limits, the forwarder's argv names none."""
    shape = _shape(CFG, HOST, False)
    argv = agent_sandbox.bwrap_argv(
        shape, RT, HOST, ["true"], facts=ON_HOST, control_fd=4, seccomp_fd=5,
        rlimits=[(6, 64), (2, 256 << 20)],
    )  # fmt: skip
    tail = argv[argv.index(HOST.forwarder) :]
    assert tail[tail.index("--rlimit") :][:4] == ["--rlimit", "6=64", "--rlimit", f"2={256 << 20}"]
    assert tail[-2:] == ["--", "true"]
    assert "--rlimit" not in _argv(tty=False)


def test_cwd_outside_the_workdir_starts_in_the_workdir() -> None:
    assert agent_sandbox.inside_cwd(CFG, "/home/u/projectX") == "/home/u/project"
    assert agent_sandbox.inside_cwd(CFG, "/home/u/project") == "/home/u/project"


# --- environment -------------------------------------------------------------


def test_environment_is_exactly_the_contract() -> None:
    host_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/u",
        "TERM": "xterm",
        "GITHUB_TOKEN": "ghp_secret",
        "GH_TOKEN": "ghp_secret",
        "AWS_SECRET_ACCESS_KEY": "x",
        "SSH_AUTH_SOCK": "/tmp/agent",
    }
    cfg = from_mapping({"sign_key": "ABCD"}, FACTS)
    env = agent_sandbox.environment(
        cfg, RT, host_env, bin_dir=HOST.bin_dir, http_port=3128, socks_port=1080
    )
    assert "ghp_secret" not in env.values()
    for gone in ("GITHUB_TOKEN", "GH_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK"):
        assert gone not in env
    for gone in ("KUBECONFIG", "GNUPGHOME"):
        assert gone not in env
    assert env["AGENT_SANDBOX"] == "1"
    assert env["AGENT_SANDBOX_BROKER_SOCKET"] == RT.broker_socket
    assert env["AGENT_SANDBOX_POLICY"] == RT.policy
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["ALL_PROXY"] == env["all_proxy"] == "socks5h://127.0.0.1:1080"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
        assert env[name] == RT.ca_bundle
    assert env["NODE_EXTRA_CA_CERTS"].endswith("/egress/ca.pem")
    assert env["GH_CONFIG_DIR"] == RT.gh_config
    assert env["GIT_CONFIG_COUNT"] == "2"
    # gpg-shim as the session's own script (started without site), in the
    # runtime directory, which the sandbox sees read-only.
    assert (env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"]) == (
        "gpg.program",
        RT.root + "/gpg-shim",
    )
    assert RT.gpg_program == RT.root + "/gpg-shim"
    assert (env["GIT_CONFIG_KEY_1"], env["GIT_CONFIG_VALUE_1"]) == ("user.signingkey", "ABCD")
    assert env["PATH"].startswith(HOST.bin_dir + ":")


def test_kubeconfig_only_when_configured() -> None:
    env = agent_sandbox.environment(
        CFG, RT, {}, bin_dir="/b", http_port=1, socks_port=2, kubeconfig=RT.kubeconfig
    )
    assert env["KUBECONFIG"] == RT.kubeconfig
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:1"


# --- Landlock ------------------------------------------------------------------


def test_landlock_shape_grants_reads_writes_and_the_two_ports() -> None:
    shape = _shape(tty=True, landlock=True)
    assert shape.tcp_connect == (4000, 4001)
    assert "/home/u" not in shape.read and RT.root in shape.read
    assert CFG.workdir in shape.write and RT.root + "/tmp" in shape.write
    assert shape.tmp == RT.root + "/tmp" and shape.env == {"A": "b"}
    assert shape.new_session is False
    assert shape.cwd == "/home/u/project/sub"
    assert "/dev/shm" not in shape.devices and "/dev/tty" in shape.devices
    assert shape.protect == () and shape.empty == ()  # Landlock cannot hold them


def test_the_two_backends_share_one_shape_but_for_what_each_can_do() -> None:
    bw, ll = _shape(), _shape(landlock=True)
    assert bw.read == ll.read and bw.deny == ll.deny and bw.cwd == ll.cwd
    assert bw.empty == ("/home/u",) and bw.hostname == "agent-sandbox" and bw.tcp_connect == ()


# --- what the session starts -----------------------------------------------------


def test_the_proxy_is_started_on_free_loopback_ports_with_the_config() -> None:
    cfg = from_mapping(
        {
            "token_command": "gh auth token",
            "resolve": ["github.com:127.0.0.1:8443"],
            "allow_cidr": ["127.0.0.1/32"],
            "upstream_ca": "/etc/ca.pem",
        },
        FACTS,
    )
    argv = install.proxy_argv(cfg, RT)
    assert "--listen=127.0.0.1:0" in argv and "--socks=127.0.0.1:0" in argv
    assert f"--egress-dir={RT.egress_dir}" in argv
    assert "--token-command=gh auth token" in argv
    assert "--resolve=github.com:127.0.0.1:8443" in argv
    assert "--allow-cidr=127.0.0.1/32" in argv
    assert "--upstream-ca=/etc/ca.pem" in argv
    assert "--allow=" + ",".join(cfg.domains) in argv


def test_the_broker_gets_the_socket_workdir_profile_and_key() -> None:
    cfg = from_mapping({"sign_key": "ABCD"}, FACTS)
    argv = install.broker_argv(cfg, RT, "bwrap")
    for flag in (
        f"--socket={RT.broker_socket}",
        f"--workdir={cfg.workdir}",
        "--sandbox=bwrap",
        f"--profile={RT.profile}",
        "--sign-key=ABCD",
    ):
        assert flag in argv
    assert not any(a.startswith("--sign-key") for a in install.broker_argv(CFG, RT, "bwrap"))


def test_brokered_commands_get_no_network_and_see_agent_sandbox() -> None:
    profile = plan.command_profile(CFG, HOST)
    assert profile["network"] == {"mode": "none"}
    assert "AGENT_SANDBOX" in profile["environment"]["allow_vars"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("name", "line", "field", "value"),
    [
        ("egress-proxy", "listening http://127.0.0.1:4711", "http_port", 4711),
        ("egress-proxy", "listening socks5://127.0.0.1:4712", "socks_port", 4712),
        ("broker-server", "listening unix:/run/x/broker.sock", "broker", "/run/x/broker.sock"),
        ("egress-proxy", "listening unix:/evil", "broker", ""),
        ("egress-proxy", "listening http://127.0.0.1:x", "http_port", 0),
        ("egress-proxy", "log: listening http://127.0.0.1:1", "http_port", 0),
    ],
)
def test_listening_lines(name: str, line: str, field: str, value: object) -> None:
    found = plan.Listening()
    plan.parse_listening(name, line, found)
    assert getattr(found, field) == value


def test_git_hooks_and_config_are_bound_read_only_after_the_workdir() -> None:
    git = ("/home/u/project/.git/hooks", "/home/u/project/.git/config")
    facts = Facts(ON_HOST.dirs | {git[0]}, ON_HOST.files | {git[1]}, ON_HOST.links)
    argv = _argv(tty=False, facts=facts)
    after = argv[argv.index("/home/u/project", argv.index("--bind")) :]
    for p in git:
        assert (p, p) in _pairs(after, "--ro-bind")
    argv = _argv(tty=False, cfg=CFG._replace(protect_git=False), facts=facts)
    assert not any(p in argv for p in git)
