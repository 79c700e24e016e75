"""The sandbox's shape as data: seccomp program, bwrap argv, Landlock spec, env (pure)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.launcher import agent_sandbox, plan, seccomp
from libbroker.launcher.agent_sandbox import Host
from libbroker.launcher.config import HostFacts, from_mapping
from libbroker.launcher.runtime import Runtime

FACTS = HostFacts(home="/home/u", cwd="/home/u/project", gh_present=False)
CFG = from_mapping({"read": ["~/.cargo"], "deny": ["/home/u/project/.env"]}, FACTS)
RT = Runtime("/run/user/1000/agent-sandbox/session-x")
HOST = Host(
    python="/home/u/.pyenv/versions/3.11/bin/python3.11",
    python_dirs=("/home/u/.pyenv/versions/3.11",),
    project_dir="/opt/agent-sandbox",
    forwarder="/opt/agent-sandbox/libbroker/launcher/forwarder.py",
    bin_dir="/home/u/.pyenv/versions/3.11/bin",
    cwd="/home/u/project/sub",
    symlinks={"/bin": "usr/bin", "/lib": "usr/lib"},
    existing=frozenset({"/usr", "/etc", "/etc/shadow", "/home/u/project/.env"}),
)


# --- seccomp: a tiny classic-BPF interpreter runs the real program ------------


def _run_bpf(prog: bytes, nr: int, arch: int, arg1: int) -> int:
    insns = [struct.unpack("<HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = struct.pack("<iIQ6Q", nr, arch, 0, 0, arg1, 0, 0, 0, 0)
    pc, acc = 0, 0
    for _ in range(len(insns) + 1):
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unknown opcode {code:#x}")
    raise AssertionError("the program does not end")


ALLOW, EPERM = 0x7FFF0000, 0x00050001


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@given(nr=st.integers(0, 0x3FFFFFFF), arg=st.integers(0, 2**64 - 1))
def test_seccomp_refuses_only_the_injection_ioctls(machine: str, nr: int, arg: int) -> None:
    prog = seccomp.program(machine)
    assert prog is not None
    (arch, ioctl), (compat_arch, compat_ioctl) = seccomp._ARCHES[machine]
    low = arg & 0xFFFFFFFF
    injecting = low in (seccomp.TIOCSTI, seccomp.TIOCLINUX)
    want = EPERM if nr == ioctl and injecting else ALLOW
    assert _run_bpf(prog, nr, arch, arg) == want
    want_compat = EPERM if nr == compat_ioctl and injecting else ALLOW
    assert _run_bpf(prog, nr, compat_arch, arg) == want_compat


def test_seccomp_refuses_x32_and_unknown_arches() -> None:
    prog = seccomp.program("x86_64")
    assert prog is not None
    assert _run_bpf(prog, 0x40000010, 0xC000003E, 0) == EPERM
    assert _run_bpf(prog, 1, 0x12345678, 0) == EPERM
    assert seccomp.program("riscv64") is None


# --- bwrap -------------------------------------------------------------------


def _argv(tty: bool, seccomp_fd: int | None = 5) -> list[str]:
    return agent_sandbox.bwrap_argv(
        CFG, RT, HOST, ["claude", "--x"], control_fd=4, seccomp_fd=seccomp_fd, tty=tty
    )


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_bwrap_has_no_network_and_dies_with_the_launcher() -> None:
    argv = _argv(tty=False)
    assert argv[:3] == ["bwrap", "--unshare-all", "--die-with-parent"]
    assert "--share-net" not in argv


def test_new_session_only_without_a_tty() -> None:
    assert "--new-session" in _argv(tty=False)
    assert "--new-session" not in _argv(tty=True)
    # no seccomp filter for this machine: --new-session is the defence
    assert "--new-session" in _argv(tty=True, seccomp_fd=None)
    assert _argv(tty=True)[_argv(tty=True).index("--seccomp") :][:2] == ["--seccomp", "5"]


def test_home_is_hidden_then_only_allowed_paths_come_back() -> None:
    argv = _argv(tty=False)
    home = argv.index("/home/u")
    assert argv[home - 1] == "--tmpfs"
    after = argv[home:]
    assert ("/home/u/.pyenv/versions/3.11", "/home/u/.pyenv/versions/3.11") in _pairs(
        after, "--ro-bind"
    )
    assert ("/home/u/.cargo", "/home/u/.cargo") in _pairs(after, "--ro-bind-try")
    assert ("/home/u/project", "/home/u/project") in _pairs(after, "--bind")
    assert ("/home/u/.claude", "/home/u/.claude") in _pairs(after, "--bind-try")
    # the deny path is masked after the workdir is bound
    assert ("/dev/null", "/home/u/project/.env") in _pairs(after, "--ro-bind")


def test_system_read_only_secrets_masked_runtime_read_only() -> None:
    argv = _argv(tty=False)
    assert ("/usr", "/usr") in _pairs(argv, "--ro-bind")
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")
    assert ("/dev/null", "/etc/shadow") in _pairs(argv, "--ro-bind")
    assert (RT.root, RT.root) in _pairs(argv, "--ro-bind")
    assert tuple(argv[argv.index("--chdir") :][:2]) == ("--chdir", "/home/u/project/sub")


def test_the_forwarder_wraps_the_command() -> None:
    argv = _argv(tty=False)
    tail = argv[argv.index("--", argv.index("--seccomp")) + 1 :]
    assert tail[:4] == [HOST.python, "-I", "-S", HOST.forwarder]
    assert f"3128={RT.http_relay}" in tail and f"1080={RT.socks_relay}" in tail
    assert tail[-3:] == ["--", "claude", "--x"]
    assert "--own-group" in tail
    assert "--own-group" not in _argv(tty=True)


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


def test_landlock_spec_grants_reads_writes_and_the_two_ports() -> None:
    spec = agent_sandbox.landlock_spec(
        CFG, RT, HOST, ["true"], http_port=4000, socks_port=4001, tmpdir=RT.root + "/tmp", tty=True
    )
    assert spec["ports"] == [4000, 4001]
    assert "/home/u" not in spec["read"]  # type: ignore[operator]
    assert RT.root in spec["read"]  # type: ignore[operator]
    assert CFG.workdir in spec["write"]  # type: ignore[operator]
    assert spec["new_session"] is False
    assert spec["cwd"] == "/home/u/project/sub"


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
    argv = plan.proxy_argv(cfg, RT)
    assert "--listen=127.0.0.1:0" in argv and "--socks=127.0.0.1:0" in argv
    assert f"--egress-dir={RT.egress_dir}" in argv
    assert "--token-command=gh auth token" in argv
    assert "--resolve=github.com:127.0.0.1:8443" in argv
    assert "--allow-cidr=127.0.0.1/32" in argv
    assert "--upstream-ca=/etc/ca.pem" in argv
    assert "--allow=" + ",".join(cfg.domains) in argv


def test_the_broker_gets_the_socket_workdir_profile_and_key() -> None:
    cfg = from_mapping({"sign_key": "ABCD"}, FACTS)
    argv = plan.broker_argv(cfg, RT, "bwrap")
    for flag in (
        f"--socket={RT.broker_socket}",
        f"--workdir={cfg.workdir}",
        "--sandbox=bwrap",
        f"--profile={RT.profile}",
        "--sign-key=ABCD",
    ):
        assert flag in argv
    assert not any(a.startswith("--sign-key") for a in plan.broker_argv(CFG, RT, "bwrap"))


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
    host = HOST._replace(existing=HOST.existing | set(git))
    argv = agent_sandbox.bwrap_argv(CFG, RT, host, ["true"], control_fd=4, seccomp_fd=5, tty=False)
    after = argv[argv.index("/home/u/project", argv.index("--bind")) :]
    for p in git:
        assert (p, p) in _pairs(after, "--ro-bind")
    off = CFG._replace(protect_git=False)
    argv = agent_sandbox.bwrap_argv(off, RT, host, ["true"], control_fd=4, seccomp_fd=5, tty=False)
    assert not any(p in argv for p in git)
