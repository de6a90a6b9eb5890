#!/usr/bin/env python3
"""Renders the tables of docs/benchmarks.md from a `warmstart bench
--export-json` file, so that every number in the document comes from one
recorded run: python3 bench/markdown.py docs/img/bench.json"""

import json
import sys

ORDER = ["cold", "warm", "prefetch-only", "bound", "sorted", "fast",
         "paralfetch", "preload-all", "vmtouch", "warmstart", "run", "daemon",
         "learning"]
NO_GAP = {"cold", "prefetch-only", "learning"}
PEERS = ["sorted", "fast", "paralfetch", "preload-all", "vmtouch"]


def t(s):
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.0f} ms"


def pct(x):
    return "–" if x is None else f"{x * 100:.0f}%"


def main(path):
    d = json.load(open(path))
    m = d["machine"]
    s = d["settings"]
    print(f"Machine: {m['cpu']}, {m['cores']} cores, "
          f"{m['memory_bytes'] / 2**30:.0f} GiB RAM, Linux {m['kernel']}, "
          f"`/` on {m['root_fs']} on {m['root_device']} "
          f"(rotational={m['rotational']}, scheduler {m['scheduler']}), "
          f"virtual machine: {m['virtualized']}. "
          f"{s['rounds']} rounds, {s['warmup']} warm-up launch, cold by {s['cold_by']}.\n")
    gaps = {}
    for p in d["programs"]:
        l = p["learned"]
        print(f"### {p['name']}\n")
        print(f"`{' '.join(p['command'])}` — ready: `{p['ready']}`; learned "
              f"{l['files']} files, {l['data_bytes'] / 2**20:.1f} MiB data, "
              f"{l['metadata_bytes'] / 2**20:.1f} MiB metadata ({l['backend']}).\n")
        print("| scenario | median | min … max | vs cold | gap captured | paired |")
        print("|---|---:|---:|---:|---:|---:|")
        for x in sorted(p["summary"], key=lambda x: ORDER.index(x["scenario"])):
            sc = x["scenario"]
            g = None if sc in NO_GAP else x["gap_captured"]
            # Exports older than the paired gap have no such field.
            pg = None if sc in NO_GAP else x.get("paired_gap")
            gaps.setdefault(sc, []).append(x["gap_captured"])
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
    for sc in ORDER:
        if sc in NO_GAP or sc not in gaps:
            continue
        per = []
        for p in d["programs"]:
            x = next((x for x in p["summary"] if x["scenario"] == sc), None)
            per.append(x["gap_captured"] if x else None)
        vals = [v for v in per if v is not None]
        mean = sum(vals) / len(vals) if vals else None
        name = f"**{sc}**" if sc == "warmstart" else sc
        print(f"| {name} | {pct(mean)} | " + " | ".join(pct(v) for v in per) + " |")
    print()
    if not any(x["scenario"] in PEERS for p in d["programs"] for x in p["summary"]):
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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/img/bench.json")
