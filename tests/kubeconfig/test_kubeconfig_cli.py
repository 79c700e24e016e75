"""kubeconfig-proxify as a console script: stdin/stdout, --in-place, exit codes."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

PROXY = "socks5://127.0.0.1:1080"
KIND = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2s=
    server: https://127.0.0.1:41235
  name: kind-lab
- cluster:
    server: https://k8s.example.com
  name: prod
contexts:
- context:
    cluster: kind-lab
    user: kind-lab
  name: kind-lab
current-context: kind-lab
kind: Config
preferences: {}
users:
- name: kind-lab
  user:
    client-key-data: a2V5
"""


def proxify(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubeconfig-proxify", *args], input=stdin, capture_output=True,
                          text=True, timeout=30)


def test_stdin_to_stdout() -> None:
    result = proxify("--proxy", PROXY, stdin=KIND)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "kubeconfig-proxify: proxified 1 cluster\n"
    clusters = yaml.safe_load(result.stdout)["clusters"]
    assert clusters[0]["cluster"]["proxy-url"] == PROXY
    assert "proxy-url" not in clusters[1]["cluster"]


def test_file_to_stdout_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(KIND)
    result = proxify(f"--proxy={PROXY}", str(path))
    assert result.returncode == 0, result.stderr
    assert "proxy-url: " + PROXY in result.stdout
    assert path.read_text() == KIND


def test_in_place_is_atomic_and_keeps_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(KIND)
    path.chmod(0o600)
    inode = path.stat().st_ino
    result = proxify("--in-place", "--proxy", PROXY, str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == "kubeconfig-proxify: proxified 1 cluster\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_ino != inode  # a rename, not a rewrite of the old file
    assert sorted(os.listdir(tmp_path)) == ["config"]  # no temporary file left behind
    assert yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["proxy-url"] == PROXY
    # Again: nothing to do, and the file is not even touched.
    inode = path.stat().st_ino
    again = proxify("--in-place", "--proxy", PROXY, str(path))
    assert again.returncode == 0
    assert again.stderr == "kubeconfig-proxify: proxified 0 clusters\n"
    assert path.stat().st_ino == inode


def test_in_place_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text(KIND)
    link = tmp_path / "config"
    link.symlink_to(real)
    assert proxify("--in-place", "--proxy", PROXY, str(link)).returncode == 0
    assert link.is_symlink()
    assert "proxy-url" in real.read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clusters: [\n", "not valid YAML"),
        ("apiVersion: v1\nkind: Config\n", "no clusters"),
        (KIND.replace("https://k8s.example.com", "'https://[::1'"), "cannot be parsed"),
        ("clusters:\n- cluster: !!python/object/apply:os.system [id]\n", "not valid YAML"),
    ],
)
def test_bad_input_exits_1_and_writes_nothing(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    before = path.stat()
    result = proxify("--in-place", "--proxy", PROXY, str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.startswith("kubeconfig-proxify: ")
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert path.read_text() == text
    assert path.stat().st_ino == before.st_ino
    assert sorted(os.listdir(tmp_path)) == ["config"]
    piped = proxify("--proxy", PROXY, stdin=text)
    assert (piped.returncode, piped.stdout) == (1, "")


def test_missing_file_and_non_utf8(tmp_path: Path) -> None:
    missing = proxify("--proxy", PROXY, str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert "cannot read" in missing.stderr
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    result = proxify("--proxy", PROXY, str(binary))
    assert result.returncode == 1
    assert "not UTF-8" in result.stderr


@pytest.mark.parametrize(
    "args",
    [[], ["--proxy", "ftp://x:1"], ["--proxy", PROXY, "--in-place"], ["--bogus"],
     ["--proxy", PROXY, "a", "b"]],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = proxify(*args, stdin=KIND)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["-h", "--help", "--version"])
def test_help_and_version(flag: str) -> None:
    result = proxify(flag)
    assert result.returncode == 0
    assert result.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_in_place_as_root_keeps_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(KIND)
    os.chown(path, 1234, 5678)
    assert proxify("--in-place", "--proxy", PROXY, str(path)).returncode == 0
    assert (path.stat().st_uid, path.stat().st_gid) == (1234, 5678)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # libyaml's C loader recursed on the C stack and died with SIGSEGV here.
        ("[" * 30000 + "]" * 30000, "nested too deeply"),
        ("{a: " * 3000 + "1" + "}" * 3000, "nested too deeply"),
        # The safe timestamp constructor raised AttributeError (exit 70).
        ("clusters: [!!timestamp x]", "cannot be constructed"),
        ("a: " + "x" * (4 * 1024 * 1024 + 1), "larger than 4 MiB"),
    ],
    ids=["deep-flow-list", "deep-flow-map", "bad-timestamp", "oversized"],
)
def test_hostile_yaml_is_a_clear_refusal(text: str, message: str) -> None:
    done = proxify("--proxy=socks5://127.0.0.1:1080", stdin=text)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""
