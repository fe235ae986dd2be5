#!/usr/bin/env python3
"""Draws Benchmarks/curves.sh's data as SVG line charts (standard library only).

    plot.py curves.data OUT_DIR

curves.data lines: `SIZE <bytes> RESULT W3 <impl> mib_per_s=...` and `CONN <n> RESULT W4|W5 <impl>
key=value...` (and `JSON`, `CLAT <n> RESULT W2 ...`). Writes size.svg (MiB/s against message size),
connections.svg (delivered messages a second against connections), memory.svg (server memory per
idle connection against connections) and latency-connections.svg (round-trip p50 and p99 with n
connections at once),
log scales where the values span decades.
"""
import html
import math
import sys

COLOURS = {"ours": "#d62728", "ours+noise": "#ff7f0e", "ours session": "#9467bd", "ours+noise session": "#e377c2",
           "nio": "#1f77b4", "nio+tls": "#17becf", "c": "#555555"}
NAMES = {"ours": "ours (plaintext)", "ours+noise": "ours (Noise)", "ours session": "ours, session (W7)",
         "ours+noise session": "ours, Noise session", "nio": "SwiftNIO", "nio+tls": "SwiftNIO + TLS 1.3",
         "c": "C, blocking sockets"}

def load(path):
    rows = []
    for line in open(path):
        words = line.split()
        if len(words) < 5 or words[2] != "RESULT":
            continue
        values = {}
        for word in words[5:]:
            if "=" in word:
                key, _, value = word.partition("=")
                try:
                    values[key] = float(value)
                except ValueError:
                    pass
        rows.append((words[0], int(words[1]), words[3], words[4], values))
    return rows

def label(x, unit):
    if unit == "bytes":
        for size, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
            if x >= size:
                return "%g %s" % (x / size, name)
        return "%d B" % x
    if x >= 1e6:
        return "%gM" % (x / 1e6)
    if x >= 1e3:
        return "%gk" % (x / 1e3)
    return "%g" % x

def chart(title, xlabel, ylabel, series, xunit, yunit, logy):
    width, height, left, right, top, bottom = 820, 440, 80, 240, 44, 56
    xs = sorted({x for points in series.values() for x, _ in points})
    ys = [y for points in series.values() for _, y in points if y > 0]
    if not xs or not ys:
        return None
    fx = lambda x: left + (math.log10(x) - math.log10(xs[0])) / max(math.log10(xs[-1]) - math.log10(xs[0]), 1e-9) * (width - left - right)
    if logy:
        lo, hi = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys)))
        fy = lambda y: height - bottom - (math.log10(y) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (height - top - bottom)
        ticks = [10 ** e for e in range(int(math.log10(lo)), int(math.log10(hi)) + 1)]
    else:
        lo, hi = 0.0, max(ys) * 1.1
        step = 10 ** math.floor(math.log10(hi / 5))
        step = next(s * step for s in (1, 2, 5, 10) if hi / (s * step) <= 6)
        fy = lambda y: height - bottom - (y - lo) / (hi - lo) * (height - top - bottom)
        ticks = [i * step for i in range(int(hi / step) + 1)]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="Verdana" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="24" font-size="15">%s</text>' % (left, html.escape(title))]
    for t in ticks:
        y = fy(t)
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>' % (left, width - right, y, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (left - 6, y + 4, label(t, yunit)))
    for x in xs:
        px = fx(x)
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e5e5e5"/>' % (px, px, top, height - bottom))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (px, height - bottom + 18, label(x, xunit)))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % ((left + width - right) / 2, height - 14, html.escape(xlabel)))
    out.append('<text transform="translate(18,%d) rotate(-90)" text-anchor="middle">%s</text>' % ((top + height - bottom) / 2, html.escape(ylabel)))
    for i, (impl, points) in enumerate(sorted(series.items(), key=lambda kv: (list(NAMES).index(kv[0]) if kv[0] in NAMES else 99, kv[0]))):
        points = sorted(p for p in points if p[1] > 0)
        colour = COLOURS.get(impl, "#999999")
        dash = ' stroke-dasharray="5,4"' if impl == "c" or impl.endswith(" p99") else ""
        out.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>' % (
            colour, dash, " ".join("%.1f,%.1f" % (fx(x), fy(y)) for x, y in points)))
        for x, y in points:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s at %s</title></circle>' % (
                fx(x), fy(y), colour, html.escape(NAMES.get(impl, impl)), label(y, yunit), label(x, xunit)))
        ly = top + 10 + i * 20
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (width - right + 14, width - right + 38, ly, ly, colour, dash))
        out.append('<text x="%d" y="%d">%s</text>' % (width - right + 44, ly + 4, html.escape(NAMES.get(impl, impl))))
    out.append("</svg>")
    return "\n".join(out) + "\n"

def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py curves.data OUT_DIR")
    rows = load(sys.argv[1])
    def series(kind, workload, key, suffix=""):
        result = {}
        for k, x, w, impl, values in rows:
            if k == kind and w == workload and key in values:
                result.setdefault(impl + suffix, []).append((x, values[key]))
        return result
    json = series("JSON", "W1", "msgs_per_s")
    json.update(series("JSON", "W7", "msgs_per_s", " session"))
    latency = {}
    for impl, points in series("JSON", "W2", "p50_us").items():
        latency[impl + " p50"] = points
    for impl, points in series("JSON", "W2", "p99_us").items():
        latency[impl + " p99"] = points
    crowd = {}
    for impl, points in series("CLAT", "W2", "p50_us").items():
        crowd[impl + " p50"] = points
    for impl, points in series("CLAT", "W2", "p99_us").items():
        crowd[impl + " p99"] = points
    for impl in list(latency) + list(crowd):
        base, _, which = impl.rpartition(" ")
        COLOURS[impl] = COLOURS.get(base, "#999999")
        NAMES[impl] = "%s %s" % (NAMES.get(base, base), which)
    charts = {
        "size.svg": chart("Throughput against message size (one connection, W3)", "message size", "MiB/s",
                          series("SIZE", "W3", "mib_per_s"), "bytes", "count", True),
        "json.svg": chart("JSON messages against size (one connection: W1 one-way, W7 in a session)", "message size (JSON)",
                          "messages a second", json, "bytes", "count", True),
        "latency.svg": chart("Round trip against size (W2: one message in flight)", "message size (JSON)", "µs",
                             latency, "bytes", "count", True),
        "connections.svg": chart("Broadcast throughput against connections (W4)", "connections",
                                 "messages delivered a second", series("CONN", "W4", "msgs_per_s"), "count", "count", True),
        "latency-connections.svg": chart("Round trip against connections (W2, every connection with one in flight)",
                                         "connections", "µs", crowd, "count", "count", True),
        "memory.svg": chart("Server memory per idle connection (W5)", "connections", "bytes per connection (RSS)",
                            series("CONN", "W5", "bytes_per_conn"), "count", "count", True),
    }
    for name, svg in charts.items():
        if svg is None:
            print("plot.py: no data for %s" % name)
            continue
        with open("%s/%s" % (sys.argv[2], name), "w") as f:
            f.write(svg)
        print("   %s/%s" % (sys.argv[2], name))

if __name__ == "__main__":
    main()
