#!/usr/bin/env python3
"""Counts the pixels of given colours in a PNG (a headless Chromium screenshot), for
tests/cli/report_test.cpp: `png_colors.py FILE RRGGBB...` prints {"width", "height", "counts":
{"RRGGBB": n}}. Python's zlib inflates; the PNG filters are undone here (8-bit RGB or RGBA,
not interlaced: what Chromium writes). A file it cannot read exits 1 with the reason."""
import json
import struct
import sys
import zlib


def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        sys.exit(f"{path}: depth {depth}, colour type {color}, interlace {interlace} not read")
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main():
    path, wanted = sys.argv[1], [c.lower().lstrip("#") for c in sys.argv[2:]]
    width, height, bpp, rows = pixels(path)
    targets = {bytes.fromhex(c): c for c in wanted}
    counts = {c: 0 for c in wanted}
    for row in rows:
        for x in range(0, len(row), bpp):
            hit = targets.get(row[x:x + 3])
            if hit:
                counts[hit] += 1
    print(json.dumps({"width": width, "height": height, "counts": counts}))


if __name__ == "__main__":
    main()
