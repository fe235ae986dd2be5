#!/usr/bin/env python3
"""Folds `perf script` output (call-graph samples) into stacks and draws them as a flame graph.

    perf script -i perf.data | swift demangle --simplified | flame.py TITLE OUT.svg [OUT.folded]

Each sample's frames become one path, root first; equal paths are counted; the SVG draws each frame
as a box as wide as its share of the samples, callers above callees (hover a box for its name, samples and share). The
folded file (`a;b;c COUNT` lines) is the format Brendan Gregg's flamegraph.pl reads. Written here
rather than fetched: this machine has no network beyond its mirrors. Standard library only.
"""
import html
import re
import sys
import zlib

def frames_of(lines):
    """Yields each sample's frames, leaf first, as function names."""
    stack = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if stack:
                yield stack
            stack = []
            continue
        if not line.startswith((" ", "\t")):
            stack = []  # a sample's header line (comm pid time: period event:)
            continue
        parts = line.strip().split(" ", 1)
        if len(parts) < 2:
            continue
        name = parts[1]
        dso = ""
        m = re.search(r" \(([^()]*)\)$", name)
        if m:
            dso = m.group(1).rsplit("/", 1)[-1]
            name = name[: m.start()]
        name = re.sub(r"\+0x[0-9a-f]+$", "", name)
        if name == "[unknown]":
            name = dso if dso.startswith("[") else "[" + (dso or "unknown") + "]"
        stack.append(name)
    if stack:
        yield stack

def fold(lines):
    counts = {}
    for stack in frames_of(lines):
        path = tuple(reversed(stack))
        counts[path] = counts.get(path, 0) + 1
    return counts

def tree(counts):
    root = {"name": "all", "count": 0, "children": {}}
    for path, n in counts.items():
        root["count"] += n
        node = root
        for name in path:
            child = node["children"].setdefault(name, {"name": name, "count": 0, "children": {}})
            child["count"] += n
            node = child
    return root

def colour(name):
    h = zlib.crc32(name.encode())
    if "swift_" in name or "Swift." in name or "[libswift" in name:
        return "rgb(%d,%d,%d)" % (90 + h % 60, 140 + (h >> 8) % 60, 220)          # runtime: blue
    if name.startswith("[") or "kernel" in name or name.startswith(("__", "entry_", "do_", "sys_")):
        return "rgb(%d,%d,%d)" % (220, 120 + (h >> 8) % 60, 60 + h % 50)           # kernel, libc: orange
    return "rgb(%d,%d,%d)" % (200 + h % 55, 80 + (h >> 8) % 100, 50 + (h >> 16) % 40)  # ours: red-yellow

def svg(root, title):
    width, row, top = 1200.0, 16, 40
    total = max(root["count"], 1)
    boxes = []
    depth_max = [0]

    def walk(node, x, depth):
        w = width * node["count"] / total
        if w < 0.3:
            return
        depth_max[0] = max(depth_max[0], depth)
        boxes.append((x, depth, w, node["name"], node["count"]))
        cx = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            walk(child, cx, depth + 1)
            cx += width * child["count"] / total

    walk(root, 0.0, 0)
    height = top + (depth_max[0] + 1) * row + 20
    out = ['<?xml version="1.0" standalone="no"?>',
           '<svg version="1.1" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg" font-family="Verdana" font-size="11">' % (width + 20, height),
           '<rect x="0" y="0" width="100%" height="100%" fill="#f8f8f8"/>',
           '<text x="10" y="22" font-size="15">%s (%d samples)</text>' % (html.escape(title), total)]
    for x, depth, w, name, n in boxes:
        y = top + depth * row  # (the root at the top: an icicle, readable from its first screen)
        label = name if w / 7 >= len(name) else (name[: max(int(w / 7) - 2, 0)] + ".." if w > 21 else "")
        out.append('<g><title>%s: %d samples (%.2f%%)</title><rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" rx="1"/>'
                   '<text x="%.1f" y="%d">%s</text></g>' % (
                       html.escape(name), n, 100.0 * n / total, 10 + x, y, max(w - 0.5, 0.1), row - 1,
                       colour(name), 12 + x, y + row - 4, html.escape(label)))
    out.append("</svg>")
    return "\n".join(out) + "\n"

def main():
    if len(sys.argv) < 3:
        sys.exit("usage: perf script | swift demangle --simplified | flame.py TITLE OUT.svg [OUT.folded]")
    counts = fold(sys.stdin)
    if not counts:
        sys.exit("flame.py: no call-graph samples on stdin (was perf record run with -g?)")
    with open(sys.argv[2], "w") as f:
        f.write(svg(tree(counts), sys.argv[1]))
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            for path, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                f.write(";".join(path) + " %d\n" % n)

if __name__ == "__main__":
    main()
