"""Route a kubeconfig's loopback clusters through a proxy.

Usage:
  kubeconfig-proxify --proxy=URL [--in-place] [FILE]
  kubeconfig-proxify -h | --help
  kubeconfig-proxify --version

Sets proxy-url on every cluster whose server is on loopback (127.0.0.0/8 in
any spelling, ::1, localhost), so kubectl reaches a lab's API server through
the egress proxy's SOCKS listener.  Every other cluster and field stays as it
was.  Reads FILE (stdin without one) and writes the result to stdout, or back
to FILE atomically with --in-place.  Says on stderr how many clusters changed.

Options:
  --proxy=URL   The proxy URL to set, e.g. socks5://127.0.0.1:1080.
  --in-place    Replace FILE (temporary file and rename, same mode).
  -h --help     Show this help.
  --version     Show the version.

Exit status: 0 done (also when nothing needed a change); 1 the input is not a
usable kubeconfig (nothing is written); 2 usage error.
"""

from __future__ import annotations

import sys

from libbroker.cli import Args, parse, run
from libbroker.errors import UsageError
from libegress import kubeconfig


def _main(args: Args) -> int:
    proxy = kubeconfig.check_proxy_url(args["--proxy"])
    path: str | None = args["FILE"]
    if args["--in-place"] and path is None:
        raise UsageError("--in-place needs a FILE")
    text, changed = kubeconfig.proxify(kubeconfig.read_text(path), proxy)
    if args["--in-place"]:
        assert path is not None
        if changed:
            kubeconfig.write_atomic(path, text)
    else:
        sys.stdout.buffer.write(text.encode("utf-8"))
    noun = "cluster" if changed == 1 else "clusters"
    sys.stderr.write(f"kubeconfig-proxify: proxified {changed} {noun}\n")
    return 0


def main() -> None:
    run(lambda: _main(parse(__doc__ or "")))


if __name__ == "__main__":
    main()
