#!/usr/bin/env python3
"""Each crate's module graph from its `crate::` paths (a module's file naming another module of the same
crate, tests left out), and the cycles in it: the "no import circles" of the house rules as a number.
Exits 1 when any crate has a cycle (CI runs it).

    scripts/module_graph.py [REPO]      (default: the current directory)
"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "."
crates = {"kernel-ladder": os.path.join(root, "src")}
for c in sorted(os.listdir(os.path.join(root, "crates"))):
    crates[c] = os.path.join(root, "crates", c, "src")
cycles = 0
for name, src in crates.items():
    # A module is a file `m.rs` or a folder `m/` (its `mod.rs` and submodules count as `m`).
    files = {}
    for f in os.listdir(src):
        path = os.path.join(src, f)
        if f.endswith(".rs") and f not in ("lib.rs", "main.rs"):
            files.setdefault(f[:-3], []).append(path)
        elif os.path.isdir(path):
            files.setdefault(f, []).extend(
                os.path.join(d, g) for d, _, gs in os.walk(path) for g in gs if g.endswith(".rs"))
    mods = set(files)
    edges = {m: set() for m in mods}
    for m in mods:
        # skip #[cfg(test)] modules (tests may import anything) and comments (a doc link is no import)
        text = "\n".join(open(f).read().split("#[cfg(test)]")[0] for f in files[m])
        text = re.sub(r"//.*", "", text)
        for t in re.findall(r"crate::(\w+)", text):
            if t in mods and t != m:
                edges[m].add(t)
        for group in re.findall(r"use crate::\{([^}]*)\}", text):
            for t in re.findall(r"(\w+)", group):
                if t in mods and t != m:
                    edges[m].add(t)
    # strongly connected components (Tarjan)
    index, low, stack, on, sccs, i = {}, {}, [], set(), [], [0]
    def strong(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index: strong(v)
    n_edges = sum(len(e) for e in edges.values())
    print(f"{name}: {len(mods)} modules, {n_edges} edges, {len(sccs)} cycle(s)" + "".join(f"\n  cycle: {' <-> '.join(c)}" for c in sccs))
    cycles += len(sccs)
sys.exit(1 if cycles else 0)
