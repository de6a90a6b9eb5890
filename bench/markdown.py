#!/usr/bin/env python3
"""Renders the tables of docs/benchmarks.md from a `warmstart bench
--export-json` file, so that every number in the document comes from one
recorded run.

    python3 bench/markdown.py bench/runs/DATE-HOST/bench.json            # per program
    python3 bench/markdown.py --compact bench/runs/DATE-HOST/bench.json  # one table

The default prints one table per program (median, min … max, share of
the cold-warm gap from medians and from paired rounds) and the mean over
programs; `--compact` prints one table for the whole run, a row per
program and a column per scenario, as docs/benchmarks.md shows it."""

import argparse
import datetime
import json

ORDER = ["cold", "warm", "prefetch-only", "bound", "demand", "contention",
         "sorted", "fast", "paralfetch", "preload-all", "vmtouch",
         "warmstart", "run", "daemon", "learning"]
NO_GAP = {"cold", "prefetch-only", "learning"}
PEERS = ["sorted", "fast", "paralfetch", "preload-all", "vmtouch"]


def t(s):
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.0f} ms"


def pct(x):
    return "–" if x is None else f"{x * 100:.0f}%"


def rank(sc):
    return ORDER.index(sc) if sc in ORDER else len(ORDER)


def header(d):
    m = d["machine"]
    s = d["settings"]
    when = ""
    if m.get("date_unix_s"):
        when = datetime.datetime.fromtimestamp(
            m["date_unix_s"], datetime.timezone.utc).strftime(" Started %Y-%m-%d %H:%M UTC.")
    return (f"Machine: {m['cpu']}, {m['cores']} cores, "
            f"{m['memory_bytes'] / 2**30:.0f} GiB RAM, Linux {m['kernel']}, "
            f"`/` on {m['root_fs']} on {m['root_device']} "
            f"(rotational={m['rotational']}, scheduler {m['scheduler']}), "
            f"virtual machine: {m['virtualized']}. "
            f"{s['rounds']} rounds, {s['warmup']} warm-up launch, cold by {s['cold_by']}.{when}\n")


def full(d):
    print(header(d))
    for p in d["programs"]:
        learned = p["learned"]
        print(f"### {p['name']}\n")
        print(f"`{' '.join(p['command'])}` — ready: `{p['ready']}`; learned "
              f"{learned['files']} files, {learned['data_bytes'] / 2**20:.1f} MiB data, "
              f"{learned['metadata_bytes'] / 2**20:.1f} MiB metadata ({learned['backend']}).\n")
        print("| scenario | median | min … max | vs cold | gap captured | paired |")
        print("|---|---:|---:|---:|---:|---:|")
        for x in sorted(p["summary"], key=lambda x: rank(x["scenario"])):
            sc = x["scenario"]
            g = None if sc in NO_GAP else x["gap_captured"]
            # Exports older than the paired gap have no such field.
            pg = None if sc in NO_GAP else x.get("paired_gap")
            vs = "–" if x["vs_cold"] is None else f"{x['vs_cold']:.2f}"
            name = f"**{sc}**" if sc == "warmstart" else sc
            out = " ⚠ outlier" if x["outlier_rounds"] else ""
            print(f"| {name} | {t(x['median_s'])} | {t(x['min_s'])} … {t(x['max_s'])} "
                  f"| {vs} | {pct(g)}{out} | {pct(pg)} |")
        print()
    print("### Mean over programs\n")
    names = [p["name"] for p in d["programs"]]
    print("| scenario | mean gap captured | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    present = {x["scenario"] for p in d["programs"] for x in p["summary"]}
    for sc in sorted(present - NO_GAP, key=rank):
        per = [gap(p, sc, "gap_captured") for p in d["programs"]]
        name = f"**{sc}**" if sc == "warmstart" else sc
        print(f"| {name} | {pct(mean(per))} | " + " | ".join(pct(v) for v in per) + " |")
    print()
    if not present & set(PEERS):
        return
    print("### warmstart against each peer, program by program\n")
    for peer in PEERS:
        wins, losses = [], []
        for p in d["programs"]:
            g = {x["scenario"]: x["gap_captured"] for x in p["summary"]}
            if g.get("warmstart") is None or g.get(peer) is None:
                continue
            (wins if g["warmstart"] > g[peer] else losses).append(p["name"])
        if wins or losses:
            print(f"- vs **{peer}**: ahead on {len(wins)} ({', '.join(wins) or '–'}), "
                  f"behind on {len(losses)} ({', '.join(losses) or '–'})")


def gap(p, sc, field):
    x = next((x for x in p["summary"] if x["scenario"] == sc), None)
    return None if x is None else x.get(field)


def mean(vals):
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def both(g, pg):
    """The gap from medians, and from paired rounds when the export has it."""
    return pct(g) if pg is None else f"{pct(g)} / {pct(pg)}"


def compact(d):
    """One row per program: cold and warm medians, then each scenario's
    median with its share of the gap, from medians / from paired rounds."""
    print(header(d))
    present = {x["scenario"] for p in d["programs"] for x in p["summary"]}
    cols = sorted(present - {"cold", "warm", "learning"}, key=rank)
    print("| program | cold | warm | " + " | ".join(cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for p in d["programs"]:
        by = {x["scenario"]: x for x in p["summary"]}
        cells = []
        for sc in cols:
            x = by.get(sc)
            if x is None:
                cells.append("–")
            elif sc in NO_GAP:
                cells.append(t(x["median_s"]))
            else:
                cells.append(f"{t(x['median_s'])}: {both(x['gap_captured'], x.get('paired_gap'))}")
        print(f"| {p['name']} | {t(by['cold']['median_s'])} | {t(by['warm']['median_s'])} | "
              + " | ".join(cells) + " |")
    cells = []
    for sc in cols:
        if sc in NO_GAP:
            cells.append("")
            continue
        g = mean([gap(p, sc, "gap_captured") for p in d["programs"]])
        pg = mean([gap(p, sc, "paired_gap") for p in d["programs"]])
        cells.append(f"**{both(g, pg)}**")
    print(f"| **mean, {len(d['programs'])} programs** | | | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="a `warmstart bench --export-json` file")
    ap.add_argument("--compact", action="store_true",
                    help="one table for the run: a row per program, a column per scenario")
    a = ap.parse_args()
    d = json.load(open(a.json))
    (compact if a.compact else full)(d)


if __name__ == "__main__":
    main()
