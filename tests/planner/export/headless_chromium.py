"""Render a local HTML page in headless Chromium (Debian's `chromium`), as the report tests
need: the DOM after the page's scripts ran, the console messages it logged, and a
screenshot read back into pixels by a small PNG decoder (no imaging library here)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Headless, as root, on a machine whose network is closed: no sandbox, GPU or background
# traffic (component updates, sync), a fresh profile per run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0")
TIMEOUT_S = 90
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")


def chromium() -> str | None:
    """Path of the Chromium binary, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass(frozen=True)
class Rendered:
    dom: str
    """The page's DOM after its scripts ran (`--dump-dom`)."""
    console: list[str]
    """Every console message the page logged (uncaught errors included)."""
    image: np.ndarray
    """The screenshot, RGB pixels (height, width, 3)."""


def render(page: Path, profile: Path, png: Path, width: int, height: int) -> Rendered:
    """Load `page` (a fresh profile in `profile`) in a `width` x `height` window: its DOM,
    console messages and screenshot (also left in `png`)."""
    binary = chromium()
    assert binary is not None
    command = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={png}", "--dump-dom", page.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=True)
    return Rendered(done.stdout, CONSOLE.findall(done.stderr), decode_png(png.read_bytes()))


def decode_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) as RGB pixels."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    position, chunks, header = 8, [], None
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind = data[position + 4:position + 8]
        body = data[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {color}")
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(chunks))
    rows = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int64)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1).astype(np.int64)
        if kind == 1:  # Sub: a running sum along the row, per channel
            line = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            line = (line + previous) & 255
        elif kind in (3, 4):  # Average and Paeth depend on the pixel just decoded
            line = np.array(_sequential(kind, line.tolist(), previous.tolist(), bpp))
        elif kind != 0:
            raise ValueError(f"unknown PNG filter {kind}")
        rows[y] = line
        previous = line
    return rows.reshape(height, width, bpp)[:, :, :3]


def _sequential(kind: int, line: list[int], above: list[int], bpp: int) -> list[int]:
    """Undo the Average (3) or Paeth (4) filter of one row."""
    out = line[:]
    for i in range(len(out)):
        left = out[i - bpp] if i >= bpp else 0
        up = above[i]
        if kind == 3:
            out[i] = (out[i] + (left + up) // 2) & 255
            continue
        corner = above[i - bpp] if i >= bpp else 0
        estimate = left + up - corner
        da, db, dc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
        guess = left if da <= db and da <= dc else up if db <= dc else corner
        out[i] = (out[i] + guess) & 255
    return out


def pixels_of(image: np.ndarray, hex_color: str) -> int:
    """How many pixels of `image` are exactly `hex_color` ('#4c78a8')."""
    rgb = [int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(image == np.array(rgb, dtype=np.uint8), axis=2).sum())
