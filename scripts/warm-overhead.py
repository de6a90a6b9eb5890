#!/usr/bin/env python3
"""What `warmstart run` costs on a launch that is already warm.

Usage: scripts/warm-overhead.py [--ws BIN] [--runs N] [-- CMD ARGS...]

Learns CMD (default: `ls /usr/lib`, `true` and Debian's python3) in a
private state directory, then times plain and wrapped launches *interleaved*
(plain, wrapped, plain, ...) so that the machine's drift hits both alike,
and prints the medians and their difference. Launches are started with
posix_spawn and timed from just before the spawn to the end of waitpid.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def default_ws():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout
    host = next((l.split()[1] for l in host.splitlines() if l.startswith("host:")), "")
    for p in (f"{root}/target/{host}/release/warmstart", f"{root}/target/release/warmstart"):
        if os.access(p, os.X_OK):
            return p
    sys.exit("no release build: run `make release` or pass --ws")


def launch(argv):
    devnull = os.open(os.devnull, os.O_WRONLY)
    acts = [(os.POSIX_SPAWN_DUP2, devnull, 1)]
    t0 = time.perf_counter_ns()
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=acts)
    _, status = os.waitpid(pid, 0)
    t1 = time.perf_counter_ns()
    os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)} failed")
    return (t1 - t0) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ws", default=None, help="warmstart binary")
    ap.add_argument("--runs", type=int, default=300, help="launches of each kind")
    ap.add_argument("cmd", nargs="*")
    a = ap.parse_args()
    ws = a.ws or default_ws()
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
    cmds = [a.cmd] if a.cmd else [["ls", "/usr/lib"], ["true"], [py, "-c", "pass"]]
    state = tempfile.mkdtemp(prefix="ws-overhead-")
    try:
        print(f"{ws}, {a.runs} interleaved launches each")
        print(f"{'command':<24} {'plain ms':>9} {'wrapped ms':>11} {'overhead ms':>12}")
        for cmd in cmds:
            wrapped = [ws, "run", "-q", "--state-dir", state, "--"] + cmd
            for _ in range(4):  # learn (2 launches), then warm up
                launch(wrapped)
            plain, wrap = [], []
            for _ in range(a.runs):
                plain.append(launch(cmd))
                wrap.append(launch(wrapped))
            mp, mw = statistics.median(plain), statistics.median(wrap)
            diffs = sorted(w - p for p, w in zip(plain, wrap))
            print(f"{' '.join(cmd)[:24]:<24} {mp:9.2f} {mw:11.2f} {mw - mp:12.2f}"
                  f"   (pairwise median {statistics.median(diffs):.2f})")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
