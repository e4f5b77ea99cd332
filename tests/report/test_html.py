"""The HTML report (report/html.py) on the real fixture runs: self-contained, every section there,
every program or compiler name escaped, the figures the models' own, and a real headless
browser (Debian's chromium) renders it to a screenshot that is not blank."""

from __future__ import annotations

import copy
import html
import os
import re
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS
from tpudiag import api
from tpudiag.results.compile import CompileReport
from tpudiag.results.profile import ProfileReport
from tpudiag.analyze.profile.timeline import step_op_rows
from tpudiag.analyze.profile.tpu_estimate import SECTION, build_tpu_estimate
from tpudiag.report.html import render_html
from tpudiag.report.units import BREAKDOWN_PARTS, fmt_s

EVIL = "<script>alert(1)</script>"
SECTIONS = ("header", "breakdown", "top-ops", "timeline", "roofline", "fusions", "suggestions")
CHROMIUM = "/usr/bin/chromium"
# Nothing the page could make a browser fetch: no URL, no src/href, no CSS import or url().
FETCHES = re.compile(r"https?://|\b(?:src|href)\s*=|@import|url\(", re.IGNORECASE)


def _step_rows(report, step: int | None = None) -> list[dict] | None:
    return step_op_rows(report.timeline, report.to_dict()["steps"]["rows"], step)


@pytest.fixture(scope="module")
def decoder():
    report = api.load_report(ARTIFACTS / "decoder")
    return report, _step_rows(report)


@pytest.fixture(scope="module")
def compiled():
    """The compile run's document; `CompileReport.from_dict` gives the page its model."""
    return api.load_report(ARTIFACTS / "compile_v5e_collective").to_dict()


def _compile_page(doc: dict) -> str:
    return render_html(CompileReport.from_dict(doc, "report.json"))


def _section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}">')
    return page[start:page.index("</section>", start)]


def _check_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower() and not FETCHES.search(page)
    assert "<style>" in page and "<link" not in page.lower() and "<img" not in page.lower()


def test_profile_page_is_self_contained_with_every_section(decoder):
    report, rows = decoder
    doc = report.to_dict()
    page = render_html(report, rows)
    _check_self_contained(page)
    for name in ("breakdown", "top-ops", "timeline", "roofline", "fusions", "suggestions"):
        assert f'<section id="{name}">' in page
    assert '<header id="header">' in page and html.escape(doc["program"]) in page
    # The breakdown's legend carries the document's own figures, part by part.
    legend = _section(page, "breakdown")
    for key, label in BREAKDOWN_PARTS:
        assert f"{label} <b>{fmt_s(doc['breakdown'][key])}</b>" in legend
    # Top ops: the document's first 15 rows, in its order, each with its bar.
    top = _section(page, "top-ops")
    names = re.findall(r"<tr><td class=\"name\"><code>(.*?)</code>", top)
    assert names == [html.escape(o["name"]) for o in doc["ops"][:15]]
    assert top.count("<svg") == len(names)
    # Timeline: step 1 (the shorter of the two: step 0 includes compiling), one box per op instance.
    assert {r["step"] for r in rows} == {1} and len(rows) == 83
    tl = _section(page, "timeline")
    assert "step 1: 83 op instances" in tl and tl.count("</title></rect>") == len(rows)
    assert all(f"<title>{html.escape(r['op'])} (" in tl for r in rows)
    # A CPU profile has no TPU target: the roofline says what it needs instead of drawing one.
    roof = _section(page, "roofline")
    assert "--target" in roof and "<circle" not in roof
    fus = _section(page, "fusions")
    for s in doc["fusions"]:
        assert f"<code>{html.escape(s['module'])}</code>: {s['breaks']} breaks" in fus
        assert all(html.escape(b["reason"]) in fus for b in s["top_breaks"])
    # A profile run without --target has no TPU compile: the section says how to get suggestions.
    sug = _section(page, "suggestions")
    assert f"tpudiag suggest {html.escape(str(doc['artifacts']['run_dir']))}" in sug and "profile --target" in sug


def test_compile_page_plots_every_op_with_flops_under_the_chips_ceilings(compiled):
    page = _compile_page(compiled)
    _check_self_contained(page)
    for name in SECTIONS[1:]:
        assert f'<section id="{name}">' in page
    t = compiled["target"]
    assert "v5e" in _section(page, "roofline") and "ridge 241 FLOP/B" in page  # 197e12 / 819e9
    assert "peak 197 TFLOP/s bf16" in page and "HBM 819 GB/s" in page
    # One point per op that has FLOPs, bytes and a time (a log-log plot cannot place the rest).
    placed = [o for m in compiled["modules"] for o in m["ops"]
              if o["flops"] > 0 and o["bytes_accessed"] > 0 and o["estimated_s"] > 0]
    roof = _section(page, "roofline")
    assert roof.count("<circle") == len(placed) > 0
    left_out = sum(len(m["ops"]) for m in compiled["modules"]) - len(placed)
    assert f"{left_out} op(s) with no FLOPs or no bytes" in roof
    # Every point is drawn on or under the ceilings (estimated_s is at least flops/peak and
    # bytes/bandwidth), and on log-log axes the ceilings are straight segments in pixel space.
    (x0, y0), (xr, yr), (x1, y1) = [tuple(map(float, p.split(","))) for p in
                                    re.search(r'<polyline points="([^"]+)"', roof).group(1).split()]
    assert y1 == yr and x0 < xr < x1 and y0 > yr  # the HBM slope rises to the ridge, then the flat peak
    for cx, cy in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', roof):
        cx, cy = float(cx), float(cy)
        ceiling_y = yr if cx >= xr else y0 + (cx - x0) / (xr - x0) * (yr - y0)
        assert cy >= ceiling_y - 0.15, (cx, cy)  # SVG y grows downwards; 0.1-px rounding either side
    assert t["peak_bf16_flops_per_s"] == 197e12
    assert "A compile run has no measured timeline" in _section(page, "timeline")
    # The three slowest modules get an op table and a fusion table, as in the terminal report.
    ranked = sorted((m for m in compiled["modules"] if m["ops"]), key=lambda m: -m["totals"]["estimated_s"])[:3]
    top = _section(page, "top-ops")
    assert [m["name"] for m in ranked] == re.findall(r"<h3><code>(.*?)</code>", top)
    assert re.findall(r"<h3><code>(.*?)</code>", _section(page, "fusions")) == [m["name"] for m in ranked]
    # The compile report's own (unpriced) suggestions: a line each, or that none clears the minimums.
    sug = _section(page, "suggestions")
    assert "<li>" in sug and (("tpudiag suggest" in sug) or ("No op clears the minimums" in sug))


def test_names_from_the_program_and_the_compiler_stay_text(decoder, compiled):
    report, rows = decoder
    doc = copy.deepcopy(report.to_dict())
    doc["ops"][0]["name"] = EVIL
    doc["ops"][1]["module"] = EVIL
    doc["ops"][2]["source"] = f"/tmp/{EVIL}.py:3"
    doc["program"] = f"{EVIL}.py"
    doc["warnings"] = [f"warning {EVIL}"]
    doc["compile"][0]["function"] = EVIL
    doc["fusions"][0]["top_breaks"][0]["producer"] = EVIL
    rows = copy.deepcopy(rows)
    rows[0]["op"], rows[1]["line"] = EVIL, EVIL
    cdoc = copy.deepcopy(compiled)
    slowest = max((m for m in cdoc["modules"] if m["ops"]), key=lambda m: m["totals"]["estimated_s"])
    slowest["ops"][0]["name"] = EVIL
    slowest["name"] = f"jit_{EVIL}"
    cdoc["modules"][0]["findings"] = [EVIL]
    cdoc["source"]["input"] = f"{EVIL}.py"
    failed = cdoc["modules"][1]  # as a module the TPU compiler refused: no ops, no totals, no fusions
    failed.update(status="failed", error=f"compiler said {EVIL}", ops=[], totals=None)
    del failed["fusions"]
    for page in (render_html(ProfileReport.from_dict(doc), rows), _compile_page(cdoc)):
        _check_self_contained(page)
        assert html.escape(EVIL) in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "alert(1)</script>" not in page


def test_profile_with_a_tpu_estimate_points_at_its_compile_run(decoder, compiled):
    """A `profile --target` report has a target but no per-op FLOPs: the roofline is in its compile run."""
    report, rows = decoder
    estimate = build_tpu_estimate(report.timeline, report.steps.count, CompileReport.from_dict(compiled))
    with_target = report.with_tpu_estimate(estimate, "tpu")
    doc = with_target.to_dict()
    page = render_html(with_target, rows)
    _check_self_contained(page)
    roof = _section(page, "roofline")
    assert "<circle" not in roof and "RUN/tpu" in roof
    assert "TPU target <b>v5e</b> (v5e:2x4)" in page
    assert all(f"<code>{html.escape(m['name'])}</code>" in _section(page, "breakdown") for m in doc[SECTION]["modules"])


def test_failed_run_without_rows_says_so(decoder):
    failed = api.load_report(ARTIFACTS / "raises")
    doc = failed.to_dict()
    page = render_html(failed)
    _check_self_contained(page)
    assert doc["status"] == "failed" and doc["reason"]
    header = page[page.index('<header id="header">'):page.index("</header>")]
    assert 'class="bad">failed</span>' in header and html.escape(doc["reason"]) in header
    assert "No timeline" in _section(page, "timeline")
    # A profile with steps but no rows given: the page says the renderer was given none.
    report, _ = decoder
    assert "no op instances of a step were given" in _section(render_html(report), "timeline")


def _png_scanlines(data: bytes) -> tuple[int, int, set[bytes]]:
    """(width, height, distinct filtered scanlines) of a PNG, with the standard library only. A page
    of one colour has a handful of distinct scanlines (one per PNG filter type); a drawn one, hundreds."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, stride = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            channels = {2: 3, 6: 4, 0: 1, 4: 2}[color]
            stride = 1 + width * channels * depth // 8
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    assert len(raw) == stride * height
    return width, height, {raw[i:i + stride] for i in range(0, len(raw), stride)}


@pytest.mark.skipif(not os.path.exists(CHROMIUM),
                    reason=f"{CHROMIUM} is absent (apt-get install chromium): the headless-browser check needs it")
def test_a_real_browser_renders_the_page(decoder, compiled, tmp_path):
    report, rows = decoder
    for name, page in (("profile", render_html(report, rows)), ("compile", _compile_page(compiled))):
        src, png = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
        src.write_text(page)
        t0 = time.monotonic()
        p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={tmp_path / ('profile-' + name)}", f"--screenshot={png}",
                            "--window-size=1280,2000", src.resolve().as_uri()],
                           capture_output=True, text=True, timeout=180)
        took = time.monotonic() - t0
        assert png.is_file(), f"chromium wrote no screenshot (exit {p.returncode}): {p.stderr[-2000:]}"
        print(f"chromium screenshot of the {name} page: {took:.1f} s")
        if os.environ.get("TPUDIAG_KEEP_SCREENSHOTS"):  # to look at them: TPUDIAG_KEEP_SCREENSHOTS=/some/dir
            shutil.copy(png, Path(os.environ["TPUDIAG_KEEP_SCREENSHOTS"]) / png.name)
        data = png.read_bytes()
        assert len(data) > 10_000
        try:
            from PIL import Image
        except ImportError:
            width, height, lines = _png_scanlines(data)
            assert (width, height) == (1280, 2000)
            assert len(lines) > 200, f"the screenshot looks blank: {len(lines)} distinct scanlines"
        else:
            with Image.open(png) as im:
                im = im.convert("RGB")
                assert im.size == (1280, 2000)
                colors = im.getcolors(maxcolors=1 << 20) or []
            assert len(colors) > 400, f"the screenshot looks blank: {len(colors)} colours"  # a one-line page: ~80
            # The breakdown's compile blue (profile) or the roofline's static-cycles blue (compile)
            # is drawn: 0x3b6fd6, the same hue in both palettes.
            assert any(c == (0x3B, 0x6F, 0xD6) and n > 500 for n, c in colors)
