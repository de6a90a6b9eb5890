#!/usr/bin/env python3
"""A program with known reads, for checking what `warmstart record` sees.

    reader.py setup DIR          make 24 files of known sizes in DIR
    reader.py read DIR [STATUS]  read them (8 whole with read(), 8 mmap'd
                                 and touched, 8 in parts with pread) and
                                 exit with STATUS (default 0)
    reader.py check DIR TRACE.json
                                 the share of those pages the trace (from
                                 `warmstart show --format json`) holds, as
                                 JSON; exits 1 below 99%

Not the project's fixture: a separate program, so that nothing about the
recorder is tuned to it.
"""
import json
import mmap
import os
import sys

PAGE = 4096
FILES = 24


def size_of(i):
    # 64 KiB to about 2.3 MiB, not all page multiples.
    return (16 + 23 * i) * PAGE + (i * 517) % PAGE


def name(d, i):
    return os.path.join(d, "f%02d.bin" % i)


def expected(i):
    """The page indexes read from file i."""
    pages = (size_of(i) + PAGE - 1) // PAGE
    if i < 8:  # read() whole
        return set(range(pages))
    if i < 16:  # mmap'd: every fourth page of the first half touched
        return set(range(0, pages // 2, 4))
    # pread: three ranges of three pages each, at known places
    out = set()
    for start in (1, pages // 3, pages - 4):
        out.update(range(start, min(start + 3, pages)))
    return out


def setup(d):
    os.makedirs(d, exist_ok=True)
    for i in range(FILES):
        with open(name(d, i), "wb") as f:
            f.write(os.urandom(size_of(i)))
        os.sync()


def read(d, status):
    for i in range(FILES):
        path = name(d, i)
        if i < 8:
            with open(path, "rb") as f:
                while f.read(65536):
                    pass
        elif i < 16:
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                total = 0
                for p in sorted(expected(i)):
                    total += m[p * PAGE]
                m.close()
        else:
            fd = os.open(path, os.O_RDONLY)
            for p in sorted(expected(i)):
                os.pread(fd, PAGE, p * PAGE)
            os.close(fd)
    sys.exit(status)


def check(d, trace_json):
    with open(trace_json) as f:
        trace = json.load(f)
    recorded = {}
    for fe in trace["files"]:
        pages = recorded.setdefault(os.path.realpath(fe["path"]), set())
        for off, length in fe["ranges"]:
            pages.update(range(off // PAGE, (off + length + PAGE - 1) // PAGE))
    want = got = 0
    missing = {}
    for i in range(FILES):
        exp = expected(i)
        have = recorded.get(os.path.realpath(name(d, i)), set())
        want += len(exp)
        got += len(exp & have)
        if exp - have:
            missing[os.path.basename(name(d, i))] = len(exp - have)
    share = got / want if want else 0.0
    print(json.dumps({"pages": want, "recorded": got, "share": round(share, 4),
                      "missing": missing, "backend": trace["meta"]["backend"]}))
    sys.exit(0 if share >= 0.99 else 1)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "setup":
        setup(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "read":
        read(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
