"""The CI artifact bundle: one `RUN/tpudiag-artifacts.tar.gz` holding a run's most useful files
under a compressed size budget (`profile --ci`, `compile --ci`).

Reads a finished run directory (profile or compile, see docs/run-directory.md) and writes one
archive into it; returns a `BundleResult` saying what went in and what was left out and why. It
does not analyze or render anything: the reports it packs were written before it runs.

Files go in by priority (`TIERS`), the most useful first; a file that does not fit in what is
left of the budget is left out, and smaller, lower-priority files after it may still go in. The
manifest and the two reports must fit, or nothing is written (`UsageError`). What was left out,
and why, is written to `BUNDLE.txt` inside the archive (docs/ci.md).

The budget is exact, not estimated: the archive is a single gzip member whose deflate stream is
cut at each tar entry by a sync flush, each entry compressed by its own compressor primed with the
32 KiB before it (pigz cuts and primes its blocks the same way). So an entry's compressed size is
known the moment it is written, and an entry that overshoots is cut off again with a `truncate`,
leaving the entries before it intact. Any gzip reader (`tar xzf`, `tarfile`, streaming `r|gz`)
sees one ordinary stream.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tpudiag.capture import rundir
from tpudiag.errors import UsageError

BUNDLE = "tpudiag-artifacts.tar.gz"
BUNDLE_INDEX = "BUNDLE.txt"
REPORT_HTML = "report.html"
MB = 1 << 20  # --max-artifact-mb counts MiB, as `du -m` does
# GitHub counts artifacts against the account's storage quota; the fixture
# runs bundle whole in 0.3 MB (decoder, compile_v5e_collective), so 50 MB leaves room for long traces.
DEFAULT_MAX_ARTIFACT_MB = 50
# A chatty program's log can reach gigabytes; its end holds the traceback and the last steps.
PROGRAM_LOG_TAIL_BYTES = 1 << 20
# zlib's default level. On the fixtures' HLO, LLO and xplane (2.2 MB): level 6 gives 385 kB in
# 59 ms, level 9 375 kB in 148 ms, level 1 486 kB in 20 ms; a CI step waits on it.
GZIP_LEVEL = 6
_WINDOW = 1 << 15  # deflate's window: an entry may refer to the 32 KiB before it
_CHUNK = 1 << 20  # read and compress 1 MiB at a time; an oversized file is abandoned mid-way
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown (RFC 1952)
_GZIP_TRAILER = 8  # CRC-32 and ISIZE
# BUNDLE.txt's tar header, the end-of-archive blocks and the record padding: ~1.5 kB to 11 kB of
# mostly zeros that deflate to ~100 bytes; the rest is room for the estimate of the index to be off.
_INDEX_SLACK = 256

# Priority tiers, most useful first. The first three files of "reports" must fit (UsageError).
TIERS = (
    "reports",  # manifest.json, report.json, report.md, report.html
    "program log",  # every program.log, cut to its last PROGRAM_LOG_TAIL_BYTES
    "trace",  # trace/plugins/profile/*/*.xplane.pb, the newest session first
    "run records",  # capture/*.json(l) (compile times for `tpudiag report`) and nested runs' manifests/reports
    "optimized HLO",  # *after_optimizations.txt, modules/*/optimized.hlo.txt: what ran
    "module results and LLO summaries",  # result.json, module.json, static_profile/, LLO utilization, schedule analysis
    "HLO memory reports and unoptimized HLO",  # *-memory-usage-report.txt, *before_optimizations.txt
    "Chrome trace",  # *.trace.json.gz: the same timeline as the xplane, already gzipped
    "LLO bundles",  # llo/*final_bundles.txt (large), vmem_report.html, the LLO copy of the HLO
    "other dumps",  # buffer assignments, live ranges, debug options, anything unrecognized
    "IR inputs",  # *.mlir (JAX IR dumps), modules/*/input.*: what the compiler was given
    "compile logs",  # modules/*/compile.log: libtpu's own noise
)
_REQUIRED = (rundir.MANIFEST, rundir.REPORT, rundir.REPORT_MD)
# The LLO summaries (the dump's pass labels, docs/compile.md); `*-final_bundles.txt` is the full listing.
_LLO_SUMMARIES = ("static-per-bundle-utilization.txt", "schedule-analysis_final_bundles.txt")


@dataclass(frozen=True)
class BundleResult:
    path: Path  # RUN/tpudiag-artifacts.tar.gz
    bytes: int  # the archive's size, at most the budget
    included: list[str]  # run-relative paths, in archive order (BUNDLE.txt last)
    left_out: list[tuple[str, str]]  # (run-relative path, why)
    notes: list[str] = field(default_factory=list)  # e.g. a program.log that was cut

    def to_dict(self) -> dict:
        return {"path": str(self.path), "bytes": self.bytes, "included": list(self.included),
                "left_out": [{"path": p, "reason": r} for p, r in self.left_out], "notes": list(self.notes)}


def tier_of(rel: PurePosixPath | str) -> int:
    """The priority tier (an index into TIERS) of a run-relative path."""
    rel = PurePosixPath(rel)
    name, dirs = rel.name, rel.parts[:-1]
    in_module = len(dirs) >= 2 and dirs[-2] == rundir.MODULES_DIR
    if not dirs and name in (*_REQUIRED, REPORT_HTML):
        return 0
    if name == rundir.PROGRAM_LOG:
        return 1
    if name.endswith(".xplane.pb"):
        return 2
    if rundir.CAPTURE_DIR in dirs or name in (*_REQUIRED, REPORT_HTML):
        return 3
    if name == "compile.log":
        return 11
    if name.endswith((".mlir", ".mlirbc")) or (in_module and name.startswith("input.")):
        return 10
    if name == rundir.MODULE_HLO or name.endswith("after_optimizations.txt"):
        return 4
    module_files = (rundir.MODULE_RESULT, rundir.MODULE_JSON, rundir.KERNEL_TABLES)
    if (in_module and name in module_files) or rundir.STATIC_PROFILE_DIR in dirs or (
            rundir.LLO_DIR in dirs and name.endswith(_LLO_SUMMARIES)):
        return 5
    if name.endswith(("memory-usage-report.txt", "before_optimizations.txt")):
        return 6
    if name.endswith(".trace.json.gz"):
        return 7
    if rundir.LLO_DIR in dirs:
        return 8
    return 9


@dataclass
class _Candidate:
    rel: str
    tier: int
    size: int  # bytes on disk
    path: Path | None = None  # None: `data` is the content
    data: bytes | None = None
    mtime: int = 0


class _Writer:
    """A tar stream compressed entry by entry into one gzip member (see the module docstring).

    Each entry gets its own compressor, primed with the last 32 KiB of the entries kept before it
    (a raw deflate stream may refer that far back, and pigz primes its blocks the same way): small,
    similar files (LLO dumps of many modules) compress as well as in one stream.
    """

    def __init__(self, f):
        self.f = f
        f.write(_GZIP_HEADER)
        self.crc = 0
        self.isize = 0  # uncompressed tar bytes so far
        self.window = b""  # the last _WINDOW uncompressed bytes kept

    @property
    def size(self) -> int:
        return self.f.tell()

    def _compressor(self):
        if self.window:
            return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS, zdict=self.window)
        return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)

    def add(self, header: bytes, chunks, limit: int) -> tuple[bool, int, bool]:
        """Append one entry if its compressed bytes fit in `limit`. Returns (kept, compressed bytes,
        exact): an entry abandoned mid-way reports the bytes it had reached, a lower bound. An
        OSError while reading leaves the archive as it was."""
        start, crc, isize, window = self.f.tell(), self.crc, self.isize, self.window
        comp = self._compressor()
        try:
            for data in itertools.chain((header,), chunks):  # lazily: a trace can be gigabytes
                crc, isize = zlib.crc32(data, crc), isize + len(data)
                window = (window + data)[-_WINDOW:]
                self.f.write(comp.compress(data))
                if self.f.tell() - start > limit:
                    return False, self._cut(start), False
        except OSError:
            self._cut(start)
            raise
        self.f.write(comp.flush(zlib.Z_SYNC_FLUSH))  # byte-aligned and not final: the next entry follows
        if self.f.tell() - start > limit:
            return False, self._cut(start), True
        self.crc, self.isize, self.window = crc, isize, window
        return True, self.f.tell() - start, True

    def _cut(self, start: int) -> int:
        written = self.f.tell() - start
        self.f.seek(start)
        self.f.truncate()
        return written

    def mark(self) -> tuple[int, int, int]:
        return self.f.tell(), self.crc, self.isize

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """Back to `mark`. The window there is not kept (32 KiB per file), so what follows starts unprimed."""
        self._cut(mark[0])
        self.crc, self.isize = mark[1], mark[2]
        self.window = b""

    def tail(self, data: bytes) -> bytes:
        """The last deflate block (BFINAL) over `data`, and the gzip trailer; not written."""
        comp = self._compressor()
        crc, isize = zlib.crc32(data, self.crc), self.isize + len(data)
        return comp.compress(data) + comp.flush(zlib.Z_FINISH) + struct.pack("<II", crc, isize & 0xFFFFFFFF)


def _tar_header(name: str, size: int, mtime: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _pad(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def _file_chunks(path: Path, size: int):
    """The first `size` bytes of a file, in chunks, then the tar padding. Raises OSError if the
    file shrank since it was measured (the header already promised `size` bytes)."""
    left = size
    with open(path, "rb") as f:
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"{path}: shorter than when it was listed")
            left -= len(chunk)
            yield chunk
    yield _pad(size)


def _program_log_tail(path: Path, size: int) -> tuple[bytes, str]:
    """The last PROGRAM_LOG_TAIL_BYTES of a log, from the first line start inside them, under a
    line that says so; and the note for BUNDLE.txt."""
    with open(path, "rb") as f:
        f.seek(size - PROGRAM_LOG_TAIL_BYTES)
        tail = f.read(PROGRAM_LOG_TAIL_BYTES)
    nl = tail.find(b"\n")
    if 0 <= nl < len(tail) - 1:  # start at a line, not in the middle of one
        tail = tail[nl + 1:]
    note = f"cut to its last {len(tail):,} of {size:,} bytes (the whole log is in the run directory)"
    return f"[tpudiag: {path.name} {note}]\n".encode() + tail, note


def _list_run(run: Path) -> tuple[list[_Candidate], list[tuple[str, str]]]:
    found, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(run):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(run).as_posix()
            if rel in (BUNDLE, BUNDLE + ".tmp"):
                continue
            if path.is_symlink() or not path.is_file():
                skipped.append((rel, "not a regular file (links are not followed)"))
                continue
            st = path.stat()
            found.append(_Candidate(rel, tier_of(rel), st.st_size, path=path, mtime=int(st.st_mtime)))
        for d in list(dirnames):  # os.walk does not descend into links to directories; say so
            if (Path(dirpath) / d).is_symlink():
                rel = (Path(dirpath) / d).relative_to(run).as_posix()
                skipped.append((rel, "a link to a directory (not followed)"))
    return found, skipped


def _order(cands: list[_Candidate]) -> list[_Candidate]:
    """Tier, then shallower paths first (a run's own program.log before a nested run's), then path;
    traces newest session first, as the analysis reads the last one."""
    out = sorted(cands, key=lambda c: (c.tier, c.rel.count("/"), c.rel))
    traces = [c for c in out if c.tier == 2]
    return [c for c in out if c.tier < 2] + sorted(traces, key=lambda c: c.rel, reverse=True) + \
        [c for c in out if c.tier > 2]


def _index_text(top: str, max_bytes: int, included: list[_Candidate], left_out: list[tuple[str, str]],
                notes: list[str], sizes: dict[str, int]) -> str:
    """BUNDLE.txt: what the bundle keeps, in what order, and what it left out and why."""
    lines = [
        f"tpudiag artifact bundle of the run directory {top}",
        f"budget: {max_bytes:,} bytes compressed ({max_bytes / MB:.2f} MB); the archive is never larger.",
        "Files go in by priority, then by path. A file that does not fit in what is left of the budget",
        "is left out, and smaller files of lower priority may still go in after it. The priorities:",
        *(f"  {i + 1:2}. {t}" for i, t in enumerate(TIERS)),
        "",
        f"included: {_files(len(included))}, {sum(c.size for c in included):,} bytes on disk (`tar tzvf` lists them)",
    ]
    if notes:
        lines += ["", "notes:", *(f"  {n}" for n in notes)]
    lines += ["", f"left out: {_files(len(left_out))}, {sum(sizes.get(p, 0) for p, _ in left_out):,} bytes on disk"]
    lines += [f"  {p}  ({sizes[p]:,} bytes): {why}" if p in sizes else f"  {p}: {why}" for p, why in left_out]
    return "\n".join(lines) + "\n"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def write_bundle(run: Path, max_bytes: int, html: str | None = None) -> BundleResult:
    """Write RUN/tpudiag-artifacts.tar.gz, at most `max_bytes` bytes, and say what it holds.

    `html`: a rendered HTML report, stored as `report.html` right after the Markdown report.
    Raises `UsageError` if the manifest and reports alone (with the index) exceed `max_bytes`,
    `InputError` if `run` is not a run directory. Written to a temporary name and renamed, so a
    `tpudiag-artifacts.tar.gz` that exists is always complete.
    """
    run = Path(run)
    rundir.read_manifest(run)  # a run directory, or InputError
    if max_bytes <= 0:
        raise UsageError(f"the artifact budget must be positive (got {max_bytes} bytes)")
    top = run.resolve().name
    cands, skipped = _list_run(run)
    if html is not None:
        data = html.encode()
        cands = [c for c in cands if c.rel != REPORT_HTML]
        cands.append(_Candidate(REPORT_HTML, 0, len(data), data=data))
    cands = _order(cands)
    required = [c for c in cands if c.rel in _REQUIRED]
    optional = [c for c in cands if c.rel not in _REQUIRED]
    missing = [(name, "reports: not in the run directory") for name in _REQUIRED
               if name not in {c.rel for c in required}]
    skipped = missing + skipped
    sizes = {c.rel: c.size for c in cands}
    # The manifest's time for BUNDLE.txt: bundling one run twice gives the same entries.
    index_mtime = int((run / rundir.MANIFEST).stat().st_mtime)

    # Room kept for BUNDLE.txt: the index as if every optional file not yet in were left out, with
    # the longest reason. Each file's line is charged a share of that index's compressed size, and
    # the share is released when the file goes in. Should the real index come out larger after all,
    # the last file kept gives way (see the end).
    worst = [(c.rel, f"{TIERS[c.tier]}: over budget (at least {c.size + max_bytes:,} bytes compressed; "
                     f"{max_bytes:,} left)") for c in optional]
    cut_logs = ["x" * 200] * sum(c.tier == 1 and c.size > PROGRAM_LOG_TAIL_BYTES for c in optional)
    base = len(zlib.compress(_index_text(top, max_bytes, cands, skipped, cut_logs, sizes).encode(), GZIP_LEVEL))
    full = len(zlib.compress(_index_text(top, max_bytes, cands, worst + skipped, cut_logs, sizes).encode(),
                             GZIP_LEVEL))
    line_chars = {rel: len(rel) + len(why) for rel, why in worst}
    share = {rel: (full - base) * n / max(sum(line_chars.values()), 1) for rel, n in line_chars.items()}
    pending = float(full - base)  # the shares of the optional files not (yet) in

    final, tmp = run / BUNDLE, run / (BUNDLE + ".tmp")
    try:
        with open(tmp, "w+b") as f:
            w = _Writer(f)
            for c in required:  # small, and they must go in: written whole, then checked
                w.add(_tar_header(f"{top}/{c.rel}", c.size, c.mtime), _file_chunks(c.path, c.size), 1 << 62)
            if w.size + full + _INDEX_SLACK + _GZIP_TRAILER > max_bytes:  # the reports, and every other file left out
                _too_small(max_bytes, w.size + full + _INDEX_SLACK + _GZIP_TRAILER, required)
            included, left_out, notes, kept = list(required), [], {}, []
            for c in optional:
                if c.tier == 1 and c.size > PROGRAM_LOG_TAIL_BYTES:
                    data, notes[c.rel] = _program_log_tail(c.path, c.size)
                    c = _Candidate(c.rel, c.tier, c.size, data=data, mtime=c.mtime)
                room = max_bytes - w.size - math.ceil(base + pending - share[c.rel] + _INDEX_SLACK) - _GZIP_TRAILER
                mark = w.mark()
                if c.data is not None:
                    header, chunks = _tar_header(f"{top}/{c.rel}", len(c.data), c.mtime), (c.data, _pad(len(c.data)))
                else:
                    header, chunks = _tar_header(f"{top}/{c.rel}", c.size, c.mtime), _file_chunks(c.path, c.size)
                try:
                    ok, used, exact = w.add(header, chunks, room)
                except OSError as e:
                    ok, why = False, f"{TIERS[c.tier]}: unreadable ({e.strerror or e})"
                else:
                    why = (f"{TIERS[c.tier]}: over budget ({'' if exact else 'at least '}{used:,} bytes "
                           f"compressed; {max(room, 0):,} left)")
                if ok:
                    pending -= share[c.rel]
                    included.append(c)
                    kept.append((mark, c))
                else:
                    left_out.append((c.rel, why))
                    notes.pop(c.rel, None)
            while True:
                text = _index_text(top, max_bytes, included, _in_order(left_out, cands) + skipped,
                                   [f"{rel}: {n}" for rel, n in notes.items()], sizes).encode()
                end = _tar_header(f"{top}/{BUNDLE_INDEX}", len(text), index_mtime) + text + _pad(len(text))
                end += b"\0" * (2 * tarfile.BLOCKSIZE)  # end-of-archive marker
                end += b"\0" * (-(w.isize + len(end)) % tarfile.RECORDSIZE)  # whole records, as tar writes them
                tail = w.tail(end)
                if w.size + len(tail) <= max_bytes:
                    break
                if not kept:  # only when the index outgrew its reserve on a budget this tight
                    _too_small(max_bytes, w.size + len(tail), required)
                mark, c = kept.pop()  # the last file in is the least useful: it gives way
                w.rewind(mark)
                included.remove(c)
                notes.pop(c.rel, None)
                left_out.append((c.rel, f"{TIERS[c.tier]}: over budget (gave way to {BUNDLE_INDEX})"))
            f.write(tail)
            size = f.tell()
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return BundleResult(path=final, bytes=size, included=[c.rel for c in included] + [BUNDLE_INDEX],
                        left_out=_in_order(left_out, cands) + skipped,
                        notes=[f"{rel}: {n}" for rel, n in notes.items()])


def _in_order(left_out: list[tuple[str, str]], cands: list[_Candidate]) -> list[tuple[str, str]]:
    pos = {c.rel: i for i, c in enumerate(cands)}
    return sorted(left_out, key=lambda item: pos[item[0]])


def _too_small(max_bytes: int, need: int, required: list[_Candidate]) -> None:
    names = ", ".join(c.rel for c in required) or "the manifest"
    mb = f"{max_bytes / MB:.3f}".rstrip("0").rstrip(".")
    raise UsageError(f"an artifact budget of {mb} MB ({max_bytes:,} bytes) is too small for the "
                     f"reports alone: {names} and {BUNDLE_INDEX} need {need:,} bytes compressed; raise "
                     f"--max-artifact-mb to at least {math.ceil(need / MB * 100) / 100:.2f}")
