"""Node-side inspection of a model directory: is it all there, is it the model you meant,
and does it sit on a local filesystem?

    python3 probe.py /mnt/models/llama --expect-model LlamaForCausalLM --json
    python3 probe.py --find /mnt --json

This file is copied into a probe Pod that runs the deployment's *own* image, so it uses the
standard library only and runs under any ``python3`` >= 3.8 (no imports from servebook, no
syntax or stdlib calls newer than 3.8).  ``servebook probe`` imports the same functions.

It is strictly read-only: it lists directories, stats paths and reads files opened
read-only; it never creates, modifies or deletes anything, and never opens anything that is
not a regular file (a FIFO named ``config.json`` would block).  A hand-written pre-flight
once mounted a typo'd path with ``DirectoryOrCreate`` and created it; this one cannot.

Findings are printed as JSON objects in the shape of ``servebook.findings.Finding.to_dict()``
(check, title, severity, subject, message, hint, evidence).  Checks that do not apply are not
reported (no ``--expect-model``, no index file): every finding printed is a verdict.
"""

import argparse
import difflib
import json
import os
import re
import stat
import sys
import time
import zipfile
from collections import deque
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Set,
    Tuple,
)

PROBE_VERSION = 1

PASS = "pass"
INFO = "info"
WARN = "warn"
FAIL = "fail"
ERROR = "error"  # could not decide: the command exits 2, never 0

# --- the checks, as plain data (servebook.preflight.probe_checks registers them) -----------

CHECKS = (
    {
        "id": "SB201",
        "title": "Model directory exists and holds files",
        "rationale": "A typo'd or absent model path is otherwise found only when the engine "
        "Pod crash-loops, after scheduling and the image pull (10-14 minutes per try); a "
        "hostPath mount with DirectoryOrCreate even creates the typo'd directory, empty, "
        "turning a fast mount failure into a slow crash loop.",
        "fix": "Check the path on the node (`servebook probe --find ROOT` lists model "
        "directories under ROOT) and point model_dir at the directory that holds the model.",
    },
    {
        "id": "SB202",
        "title": "config.json present and valid",
        "rationale": "The engine reads config.json first to choose the architecture; without "
        "it, or with a truncated one, the server exits at startup after the Pod was "
        "scheduled and its image pulled.",
        "fix": "Download config.json with the weights (`huggingface-cli download ORG/NAME "
        "--local-dir DIR`), or point at the directory that holds it.",
    },
    {
        "id": "SB203",
        "title": "config.json is the expected model",
        "rationale": "A directory holding a different model's files serves that model under "
        "the requested name: the deployment comes up healthy and every answer and benchmark "
        "is about some other model.",
        "fix": "Point model_dir at the directory of the model the recipe names, or pass "
        "--expect-model one of the architectures or the _name_or_path in its config.json.",
    },
    {
        "id": "SB204",
        "title": "Weight files present",
        "rationale": "A directory with a config but no weights (a download that fetched the "
        "small files first, a copy that skipped large files) fails only at model load.",
        "fix": "Download the weights (*.safetensors) into the directory and probe again.",
    },
    {
        "id": "SB205",
        "title": "Every shard and tensor the index names is present",
        "rationale": "An index naming shards the directory does not hold (92 of 96 shards) "
        "or tensors a shard lacks means a download or copy stopped part way: the engine "
        "fails at load time, after minutes of reading the shards that are there.",
        "fix": "Resume the download (`huggingface-cli download ORG/NAME --local-dir DIR` "
        "fetches only what is missing) and probe again.",
    },
    {
        "id": "SB206",
        "title": "Weight files intact (header parses, size matches)",
        "rationale": "A truncated, zero-byte, over-long or garbage shard (an interrupted "
        "copy, a full disk, a Git LFS pointer) passes a file-count check and fails when the "
        "engine maps it, or loads bytes that are not the model.",
        "fix": "Delete the damaged files listed and download them again (`huggingface-cli "
        "download` verifies sizes); with Git LFS pointers run `git lfs pull`.",
    },
    {
        "id": "SB207",
        "title": "Index total_size matches the tensors",
        "rationale": "An index whose metadata.total_size disagrees with the tensors its "
        "shards hold comes from another revision or a partial copy: the files on disk are "
        "not the set the index describes.",
        "fix": "Download the index and the shards again from one revision.",
    },
    {
        "id": "SB208",
        "title": "No leftovers of an unfinished download",
        "rationale": "*.incomplete, *.part, *.tmp and lock files mean a download is still "
        "running or was abandoned: the directory can look complete by count while a writer "
        "is still filling it, or the missing bytes sit only in the temporary file.",
        "fix": "Let the download finish (or resume it), remove what is left over, and probe again.",
    },
    {
        "id": "SB209",
        "title": "Every symlink resolves",
        "rationale": "A link whose target is missing (a Hugging Face cache snapshot whose "
        "blob was pruned or never finished, a copy that kept links but not their targets) "
        "fails with file-not-found at model load.",
        "fix": "Download into the cache again (`huggingface-cli download ORG/NAME`), or copy "
        "the model with links dereferenced (`cp -rL SRC DST`).",
    },
    {
        "id": "SB210",
        "title": "Tokenizer present",
        "rationale": "Without a tokenizer the server fails at startup (or serves token ids "
        "only): every chat and completion request fails.",
        "fix": "Download tokenizer.json (or tokenizer.model, or vocab.json + merges.txt) "
        "with the model, or give the engine --tokenizer DIR.",
    },
    {
        "id": "SB211",
        "title": "Weights on a local filesystem (the directory's own mount)",
        "rationale": "Weights read over a network filesystem (NFS, SMB, CephFS, Lustre, 9p, "
        "object-store FUSE mounts) load often 10x slower than from local disk, which pushes "
        "startup past the readiness timeout: the Pod is killed and restarted in a loop.  "
        "The directory's own mount decides, not its parent's (an NFS mount below a local "
        "directory is still NFS).",
        "fix": "Copy the weights to a node-local disk (ext4/xfs, e.g. NVMe via hostPath) and "
        "point model_dir there, or raise the startup timeout knowingly.",
    },
    {
        "id": "SB212",
        "title": "Model directories found under the search root",
        "rationale": "On a node you cannot log into, knowing which directories hold complete "
        "models avoids guessing model_dir and paying a failed deploy for each guess.",
        "fix": "Use a directory reported as passing every check as model_dir; for another "
        "one, `servebook probe DIR` says what is wrong with it.",
    },
    {
        "id": "SB213",
        "title": "Search covered the whole tree",
        "rationale": "A search that stopped at its depth or time bound has not seen every "
        "directory; reading its 'not found' as 'not there' sends you to the wrong place.",
        "fix": "Search a narrower ROOT, or raise --max-depth / --timeout.",
    },
)

_CHECK_BY_ID = {c["id"]: c for c in CHECKS}


def finding(
    check: str,
    severity: str,
    subject: str,
    message: str,
    evidence: Optional[Dict[str, Any]] = None,
    hint: str = "",
) -> Dict[str, Any]:
    """One verdict, shaped as ``servebook.findings.Finding.to_dict()``.  Failing and warning
    findings carry the check's fix as their hint unless a sharper one is given."""
    c = _CHECK_BY_ID[check]
    if not hint and severity in (FAIL, WARN):
        hint = c["fix"]
    return {
        "check": check,
        "title": c["title"],
        "severity": severity,
        "subject": subject,
        "message": message,
        "hint": hint,
        "evidence": evidence or {},
    }


def exit_code(findings: Iterable[Dict[str, Any]]) -> int:
    """2 if any check could not decide, else 1 if any failed, else 0 (as servebook's)."""
    worst = 0
    for f in findings:
        if f["severity"] == ERROR:
            return 2
        if f["severity"] == FAIL:
            worst = 1
    return worst


def _failed(f: Dict[str, Any]) -> bool:
    return f["severity"] in (FAIL, ERROR)


def _listing(items: List[str], limit: int = 5) -> str:
    """'a, b, c and 12 more': a message names a few; the evidence carries them all."""
    if len(items) <= limit:
        return ", ".join(items)
    return "{} and {} more".format(", ".join(items[:limit]), len(items) - limit)


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return (
                "{} {}".format(int(size), unit) if unit == "B" else "{:.1f} {}".format(size, unit)
            )
        size /= 1024
    return "{} B".format(n)  # unreachable


# --- safetensors ---------------------------------------------------------------------------

# The safetensors library refuses headers above 100 MB; so do we (a garbage length field
# would otherwise have us read gigabytes).
MAX_HEADER_BYTES = 100000000

# Bits per element by safetensors dtype name.  An unknown (newer) dtype skips the
# shape-versus-offsets check for that tensor rather than failing the file.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

_LFS_POINTER = b"version https://git-lfs"


class SafetensorsInfo(NamedTuple):
    path: str
    size: int  # -1 when the file could not be stat'ed
    problem: str  # "" when intact
    tensors: Dict[str, int]  # tensor name -> bytes, from the header
    expected_size: int  # 8 + header length + end of the last tensor; -1 if unknown


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def inspect_safetensors(path: str) -> SafetensorsInfo:
    """Parse a safetensors header (8-byte little-endian length, then that many bytes of
    JSON) and compare the file size with what the tensor offsets require.  Reads the header
    and a small sample of the tensor data (``_hole_problem``), never all of it."""

    def bad(size: int, problem: str) -> SafetensorsInfo:
        return SafetensorsInfo(path, size, problem, {}, -1)

    try:
        st = os.stat(path)
    except OSError as e:
        return bad(-1, "cannot stat: {}".format(e.strerror))
    if not stat.S_ISREG(st.st_mode):
        return bad(-1, "not a regular file")
    size = st.st_size
    if size == 0:
        return bad(0, "empty file (0 bytes)")
    raw, n, problem = _read_header(path, size)
    if problem:
        return bad(size, problem)
    header, problem = _json_document(raw)
    if problem.startswith("not valid JSON"):
        return bad(size, "header is not valid JSON (garbage, or not safetensors)")
    if problem:
        return bad(size, "header is {}".format(problem))
    if not isinstance(header, dict):
        return bad(size, "header is not a JSON object")
    tensors, data_end, problem = _tensor_sizes(header)
    if problem:
        return bad(size, problem)
    expected = 8 + n + data_end
    if size < expected:
        problem = "truncated: {} of the {} bytes its header requires ({:.1f}%)".format(
            size, expected, 100.0 * size / expected
        )
    elif size > expected:
        problem = "over-long: {} bytes beyond the {} its header accounts for".format(
            size - expected, expected
        )
    else:
        problem = _hole_problem(path, st, 8 + n, size)
    return SafetensorsInfo(path, size, problem, tensors, expected)


def _read_header(path: str, size: int) -> Tuple[bytes, int, str]:
    """A safetensors file's header bytes and its length field (checked against ``size``),
    or why they cannot be read."""
    try:
        with open(path, "rb") as f:
            first = f.read(8)
            if len(first) < 8:
                return b"", 0, "truncated: {} bytes, less than the 8-byte length".format(size)
            if first == _LFS_POINTER[:8]:
                return b"", 0, "a Git LFS pointer file ({} bytes), not weights".format(size)
            n = int.from_bytes(first, "little")
            if n < 2 or n > MAX_HEADER_BYTES:
                return b"", 0, "not safetensors: header length field reads {}".format(n)
            if 8 + n > size:
                msg = "truncated or garbage: header length field says {} bytes, {} follow"
                return b"", 0, msg.format(n, size - 8)
            return f.read(n), n, ""
    except OSError as e:
        return b"", 0, "cannot read: {}".format(e.strerror)


def _tensor_sizes(header: Dict[str, Any]) -> Tuple[Dict[str, int], int, str]:
    """Each tensor's size in bytes and where the data ends, from a parsed header; or the
    first tensor entry that is malformed."""
    tensors: Dict[str, int] = {}
    data_end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(t)
        if problem:
            return {}, 0, "tensor {!r}: {}".format(name, problem)
        begin, end = t["data_offsets"]
        tensors[name] = end - begin
        data_end = max(data_end, end)
    return tensors, data_end, ""


# Where a shard's data is sampled for a hole: this many regions of this many bytes, spread
# evenly over the data (the header is read whole anyway); data shorter than one region is
# not judged.
HOLE_SAMPLES = 16
HOLE_SAMPLE_BYTES = 4096


def _hole_problem(path: str, st: os.stat_result, begin: int, size: int) -> str:
    """A shard of the right size whose data was never written: preallocated by a
    downloader, or an interrupted copy that set the length first.  It reads as zeros, and
    vLLM would load them as weights.  Judged on a sample of the data (``HOLE_SAMPLES``
    regions), with the blocks allocated on disk as evidence: all of the sample zeros, or
    most of it zeros in a file with less than half its bytes allocated (sparse).  Sparse
    alone is no verdict: compressing and FUSE filesystems report fewer blocks for real
    data."""
    length = size - begin
    if length < HOLE_SAMPLE_BYTES:
        return ""
    step = max(HOLE_SAMPLE_BYTES, (length - HOLE_SAMPLE_BYTES) // max(1, HOLE_SAMPLES - 1))
    zero = bytes(HOLE_SAMPLE_BYTES)
    zeros = total = 0
    try:
        with open(path, "rb") as f:
            for at in range(begin, size - HOLE_SAMPLE_BYTES + 1, step):
                f.seek(at)
                chunk = f.read(HOLE_SAMPLE_BYTES)
                total += 1
                zeros += chunk == zero[: len(chunk)]
    except OSError as e:
        return "cannot read its data: {}".format(e.strerror)
    allocated = getattr(st, "st_blocks", 0) * 512
    sparse = allocated < size // 2
    if total and (zeros == total or (sparse and 2 * zeros > total)):
        return (
            "data unwritten: {} of {} sampled regions of its tensor data are all zeros, and "
            "{} of its {} are allocated on disk (a preallocated download or an interrupted "
            "copy; the engine would load zeros)".format(
                zeros, total, _human_bytes(allocated), _human_bytes(size)
            )
        )
    return ""


def _tensor_problem(t: Any) -> str:
    if not isinstance(t, dict):
        return "entry is not an object"
    dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
    if not isinstance(dtype, str):
        return "no dtype"
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        return "shape is not a list of non-negative integers"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return "data_offsets is not [begin, end] with 0 <= begin <= end"
    bits = DTYPE_BITS.get(dtype)
    if bits is not None:
        numel = 1
        for d in shape:
            numel *= d
        if (numel * bits) % 8 == 0 and numel * bits // 8 != offsets[1] - offsets[0]:
            return "{} {} needs {} bytes but data_offsets span {}".format(
                dtype, shape, numel * bits // 8, offsets[1] - offsets[0]
            )
    return ""


def _zip_problem(path: str) -> str:
    """PyTorch's .bin files are zip archives since torch 1.6: the central directory sits at
    the end, so a truncated file does not open.  Older pickle-format files cannot be
    verified without torch; those return ''."""
    try:
        st = os.stat(path)
    except OSError as e:
        return "cannot stat: {}".format(e.strerror)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size == 0:
        return "empty file (0 bytes)"
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LFS_POINTER))
            if head == _LFS_POINTER:
                return "a Git LFS pointer file ({} bytes), not the weights".format(st.st_size)
            if head[:2] != b"PK":
                return ""  # legacy pickle format: not verifiable with the stdlib
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                z.infolist()
    except zipfile.BadZipFile:
        return "truncated or damaged zip archive (PyTorch checkpoint)"
    except OSError as e:
        return "cannot read: {}".format(e.strerror)
    return ""


def _gguf_problem(path: str) -> str:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return "cannot read: {}".format(e.strerror)
    if magic != b"GGUF":
        return "no GGUF magic at the start (truncated or not a GGUF file)"
    return ""


# --- mounts --------------------------------------------------------------------------------

PROC_MOUNTINFO = "/proc/self/mountinfo"
# A node with ten thousand mounts writes about 2 MiB.
MOUNTINFO_MAX_BYTES = 64 * 1024 * 1024


class Mount(NamedTuple):
    mount_id: str
    parent_id: str
    root: str  # the path inside the source filesystem that is mounted here
    mount_point: str
    fstype: str
    source: str
    line: int  # 1-based line number in the mountinfo file


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mount_field(field: str) -> str:
    r"""The kernel writes space, tab, newline and backslash in paths as octal escapes
    (``\040``, ``\011``, ``\012``, ``\134``)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> List[Mount]:
    """Parse ``/proc/<pid>/mountinfo`` (proc(5)):
    ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue``.
    Lines that do not have that shape are skipped."""
    mounts: List[Mount] = []
    for i, line in enumerate(text.splitlines(), 1):
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3:
            continue
        mounts.append(
            Mount(
                mount_id=fields[0],
                parent_id=fields[1],
                root=unescape_mount_field(fields[3]),
                mount_point=unescape_mount_field(fields[4]),
                fstype=fields[sep + 1],
                source=unescape_mount_field(fields[sep + 2]),
                line=i,
            )
        )
    return mounts


def path_contains(mount_point: str, path: str) -> bool:
    """Component-wise containment: ``/data`` contains ``/data/x`` but not ``/data2``."""
    if mount_point == "/":
        return path.startswith("/")
    mp = mount_point.rstrip("/")
    return path == mp or path.startswith(mp + "/")


def mount_for(path: str, mounts: List[Mount]) -> Optional[Mount]:
    """The mount a (real, absolute) path lives on: the longest mount point containing it.
    Among mounts stacked on one mount point the last listed is the visible one."""
    best: Optional[Mount] = None
    for m in mounts:
        if path_contains(m.mount_point, path) and (
            best is None or len(m.mount_point.rstrip("/")) >= len(best.mount_point.rstrip("/"))
        ):
            best = m
    return best


# fstype -> what it is.  Parallel filesystems (Lustre, GPFS, BeeGFS, Weka) are network
# filesystems too: model load speed depends on the fabric, not the node.
NETWORK_FS = {
    "nfs": "NFS",
    "nfs4": "NFS",
    "cifs": "SMB/CIFS",
    "smb3": "SMB",
    "smbfs": "SMB",
    "ceph": "CephFS",
    "glusterfs": "GlusterFS",
    "lustre": "Lustre",
    "gpfs": "IBM Storage Scale (GPFS)",
    "beegfs": "BeeGFS",
    "wekafs": "WekaFS",
    "9p": "9P (host share)",
    "afs": "AFS",
    "ncpfs": "NetWare",
    "coda": "Coda",
    "pvfs2": "OrangeFS",
    "orangefs": "OrangeFS",
    "davfs": "WebDAV",
    "vboxsf": "VirtualBox shared folder",
}
# FUSE subtypes (``fuse.<name>``, or the source of a plain ``fuse`` mount).
NETWORK_FUSE = {
    "s3fs": "S3 object store",
    "gcsfuse": "Google Cloud Storage object store",
    "rclone": "rclone remote",
    "juicefs": "JuiceFS (object store)",
    "sshfs": "SSH",
    "goofys": "S3 object store",
    "geesefs": "S3 object store",
    "mountpoint-s3": "S3 object store",
    "mount-s3": "S3 object store",
    "blobfuse": "Azure Blob object store",
    "blobfuse2": "Azure Blob object store",
    "ossfs": "Alibaba OSS object store",
    "alluxio-fuse": "Alluxio",
    "s3ql": "S3 object store",
    "ceph-fuse": "CephFS",
    "glusterfs": "GlusterFS",
    "cvmfs": "CernVM-FS",
    "davfs": "WebDAV",
    "lizardfs": "LizardFS",
    "mfs": "MooseFS",
    "seaweedfs": "SeaweedFS",
    "weed": "SeaweedFS",
}


def _words(text: str) -> FrozenSet[str]:
    return frozenset(text.split())


LOCAL_FS = _words(
    "ext2 ext3 ext4 xfs btrfs zfs f2fs jfs reiserfs bcachefs nilfs2 overlay aufs tmpfs ramfs "
    "devtmpfs hugetlbfs squashfs erofs iso9660 udf vfat exfat ntfs ntfs3 fuseblk"
)
LOCAL_FUSE = _words("fuse-overlayfs lxcfs squashfuse squashfuse_ll ntfs-3g")

_NETWORK_SOURCE = re.compile(r"^(//[^/]|[^/\s]+:/)")  # //server/share, host:/export


def classify_fs(fstype: str, source: str) -> Tuple[str, str]:
    """(severity, what it is) for a mount: FAIL for network filesystems, PASS for local
    ones, WARN for a type this probe does not know."""
    fstype = fstype.lower()
    if fstype in NETWORK_FS:
        return FAIL, "{}, a network filesystem".format(NETWORK_FS[fstype])
    if fstype in LOCAL_FS:
        return PASS, "local filesystem"
    if fstype == "fuse" or fstype.startswith("fuse."):
        sub = fstype[5:] if fstype.startswith("fuse.") else os.path.basename(source.lower())
        if sub in NETWORK_FUSE:
            return FAIL, "FUSE mount of {}, a network filesystem".format(NETWORK_FUSE[sub])
        if sub in LOCAL_FUSE:
            return PASS, "local FUSE filesystem"
        return WARN, "FUSE mount of unknown kind ({}): may be an object store".format(
            sub or "no subtype"
        )
    if _NETWORK_SOURCE.match(source):
        return FAIL, "{}, whose source looks like a network export".format(fstype)
    return WARN, "filesystem type {} is unknown to this probe".format(fstype)


# --- the model directory -------------------------------------------------------------------

WEIGHT_SUFFIXES = (".safetensors", ".gguf")
_BIN_WEIGHTS = re.compile(r"^pytorch_model.*\.bin$")
_SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d+)-of-(?P<n>\d+)\.(?P<ext>safetensors|bin)$")
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
LEFTOVER_SUFFIXES = (
    ".incomplete",  # huggingface_hub (cache blobs and --local-dir)
    ".part",  # many downloaders
    ".partial",  # rclone
    ".tmp",
    ".aria2",  # aria2c control file: the download is unfinished
    ".gstmp",  # gsutil
    ".crdownload",
    ".lock",
)
# huggingface_hub keeps lock files after successful downloads in these bookkeeping folders;
# a lock file there is not a sign of an unfinished download.
_LOCK_KEEPING_DIRS = (".locks", os.path.join(".cache", "huggingface"))
_SKIP_WALK = {".git"}
WALK_MAX_DEPTH = 4
WALK_MAX_ENTRIES = 50000
TOKENIZER_JSON_MAX_BYTES = 512 * 1024 * 1024


class _Entry(NamedTuple):
    name: str
    path: str
    is_link: bool
    exists: bool  # the link target (or the file) exists
    is_file: bool  # a regular file, links followed
    is_dir: bool
    size: int


def _scan(path: str) -> List[_Entry]:
    entries: List[_Entry] = []
    with os.scandir(path) as it:
        for e in it:
            is_link = e.is_symlink()
            try:
                st = os.stat(e.path)
                exists = True
            except OSError:
                st = None
                exists = False
            entries.append(
                _Entry(
                    name=e.name,
                    path=e.path,
                    is_link=is_link,
                    exists=exists,
                    is_file=bool(st and stat.S_ISREG(st.st_mode)),
                    is_dir=bool(st and stat.S_ISDIR(st.st_mode)),
                    size=st.st_size if st else -1,
                )
            )
    entries.sort(key=lambda x: x.name)
    return entries


# The same bounds as servebook's own reader of user files (``servebook.inputs``, which this
# stdlib-only script cannot import): only a regular file, opened non-blocking; a size bound;
# nesting at most this deep (a RecursionError never escapes a check).
MAX_JSON_DEPTH = 100


def _read_regular(path: str, max_bytes: int) -> Tuple[Optional[bytes], str]:
    """(content, problem): problem is '' when ``path`` is a regular file of at most
    ``max_bytes`` that could be read; a FIFO or device is never opened for reading."""
    try:
        st = os.stat(path)
    except OSError as e:
        return None, "cannot stat: {}".format(e.strerror)
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    if st.st_size > max_bytes:
        return None, "{} is too large to be this file".format(_human_bytes(st.st_size))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, "not a regular file"
            raw = f.read(max_bytes + 1)
    except OSError as e:
        return None, "cannot read: {}".format(e.strerror)
    if len(raw) > max_bytes:
        return None, "more than {} is too large to be this file".format(_human_bytes(max_bytes))
    return raw, ""


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether parsed JSON nests more than ``limit`` levels (without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return False


def _json_document(raw: bytes) -> Tuple[Any, str]:
    """(document, problem) of JSON bytes: problem is '' when they parsed within the bounds."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except RecursionError:
        return None, "nested deeper than {} levels".format(MAX_JSON_DEPTH)
    except (UnicodeDecodeError, ValueError) as e:
        return None, "not valid JSON ({})".format(str(e)[:120] or "garbage")
    if _deeper_than(doc, MAX_JSON_DEPTH):
        return None, "nested deeper than {} levels".format(MAX_JSON_DEPTH)
    return doc, ""


def _read_json_file(path: str, max_bytes: int = 64 * 1024 * 1024) -> Tuple[Any, str]:
    """(document, problem): problem is '' when the file parsed."""
    raw, problem = _read_regular(path, max_bytes)
    if raw is None:
        return None, problem
    if not raw:
        return None, "empty file (0 bytes)"
    return _json_document(raw)


def hf_cache_repo(real_path: str) -> Optional[str]:
    """'org/name' when real_path is a Hugging Face cache snapshot
    (``.../models--org--name/snapshots/<rev>``), else None."""
    parts = real_path.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--") :].replace("--", "/")
    return None


def _expect_model_matches(expect: str, config: Dict[str, Any], real_path: str) -> Tuple[bool, str]:
    """Does config.json describe the expected model?  X matches, case-insensitively, one of
    ``architectures``, or ``_name_or_path`` (whole, or its last path component against X's),
    or the repository of a Hugging Face cache snapshot the directory is.  ``model_type`` is
    deliberately *not* accepted: a family name ("llama") is shared by many different models,
    so it would let a different model's config pass."""
    x = expect.strip().lower()
    x_last = x.rstrip("/").split("/")[-1]
    archs = config.get("architectures")
    if isinstance(archs, list):
        for a in archs:
            if isinstance(a, str) and a.lower() == x:
                return True, "architectures lists {}".format(a)
    name = config.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        n = name.strip().lower().rstrip("/")
        if n == x or n.split("/")[-1] == x_last:
            return True, "_name_or_path is {}".format(name)
    repo = hf_cache_repo(real_path)
    if repo and repo.lower() == x:
        return True, "the directory is a Hugging Face cache snapshot of {}".format(repo)
    return False, ""


def _walk(top: str) -> Tuple[List[str], List[Tuple[str, str]], int, bool]:
    """Walk the model directory (links not followed, bounded): (leftover files,
    [(dangling link, its target)], links seen, bound hit)."""
    leftovers: List[str] = []
    dangling: List[Tuple[str, str]] = []
    links = 0
    seen = 0
    stack = [(top, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                seen += 1
                if seen > WALK_MAX_ENTRIES:
                    return leftovers, dangling, links, True
                rel = os.path.relpath(e.path, top)
                if e.is_symlink():
                    links += 1
                    if not os.path.exists(e.path):
                        dangling.append((rel, os.readlink(e.path)))
                        continue
                if e.is_dir(follow_symlinks=False):
                    if e.name not in _SKIP_WALK and depth < WALK_MAX_DEPTH:
                        stack.append((e.path, depth + 1))
                    continue
                if e.name.endswith(LEFTOVER_SUFFIXES):
                    if e.name.endswith(".lock") and any(
                        rel.startswith(k + os.sep) for k in _LOCK_KEEPING_DIRS
                    ):
                        continue
                    leftovers.append(rel)
    return sorted(leftovers), sorted(dangling), links, False


def _hf_blob_leftovers(real_dir: str) -> List[str]:
    """In a Hugging Face cache snapshot, ``blobs/<etag>.incomplete`` without a finished
    ``blobs/<etag>`` is a download in progress or abandoned."""
    if hf_cache_repo(real_dir) is None:
        return []
    blobs = os.path.join(os.path.dirname(os.path.dirname(real_dir)), "blobs")
    out: List[str] = []
    try:
        names = sorted(os.listdir(blobs))
    except OSError:
        return out
    for name in names:
        if name.endswith(".incomplete"):
            etag = name.split(".")[0]
            if not os.path.exists(os.path.join(blobs, etag)):
                out.append(os.path.join("..", "..", "blobs", name))
    return out


def check_directory(
    path: str,
    role: str = "model",
    expect_model: Optional[str] = None,
    mounts: Optional[List[Mount]] = None,
    mount_error: str = "",
) -> List[Dict[str, Any]]:
    """Every probe verdict on one model directory.  ``role`` is "model" or "draft" (a draft
    may use its target's tokenizer).  ``mounts`` None with ``mount_error`` set: the
    filesystem could not be determined (an ERROR finding, never a silent pass)."""
    subject = path if role == "model" else "{} (draft)".format(path)
    out: List[Dict[str, Any]] = []

    # SB201: the directory itself.  When it fails nothing else is checked.
    first = _check_exists(path, subject)
    out.append(first)
    if _failed(first):
        return out
    real = os.path.realpath(path)
    entries = _scan(real)
    by_name = {e.name: e for e in entries}

    # SB202 / SB203: config.json.
    parsed, config = _check_config(by_name, real, subject)
    out.append(parsed)
    if expect_model is not None:
        out.append(_check_expect(expect_model, config, real, subject))

    # SB204-SB207: weights.
    out.extend(_check_weights(real, entries, subject))

    # SB208 / SB209: leftovers and links.
    out.extend(_check_leftovers_and_links(real, subject))

    # SB210: tokenizer.
    out.append(_check_tokenizer(by_name, role, subject))

    # SB211: filesystem of the directory's own mount (and of where weight links lead).
    weight_paths = [e.path for e in entries if _is_weight_name(e.name) and e.exists]
    out.extend(_check_mounts(real, weight_paths, mounts, mount_error, subject))
    return out


def _check_config(
    by_name: Dict[str, _Entry], real: str, subject: str
) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """SB202: config.json is there and parses as a JSON object; the finding and the config
    (None when it does not)."""
    cfg = by_name.get("config.json")
    if cfg is None:
        msg = "no config.json in {}".format(real)
        if "snapshots" in by_name and "refs" in by_name:
            msg += " (a Hugging Face cache repository folder: the model is in snapshots/<rev>)"
        return finding(
            "SB202", FAIL, subject, msg, {"path": os.path.join(real, "config.json")}
        ), None
    if cfg.is_link and not cfg.exists:
        return finding(
            "SB202",
            FAIL,
            subject,
            "config.json is a link to {}, which does not exist".format(os.readlink(cfg.path)),
        ), None
    doc, problem = _read_json_file(cfg.path)
    if problem:
        return finding("SB202", FAIL, subject, "config.json: {}".format(problem)), None
    if not isinstance(doc, dict):
        return finding("SB202", FAIL, subject, "config.json is not a JSON object"), None
    parsed = finding(
        "SB202",
        PASS,
        subject,
        "config.json parses: architectures {}, model_type {}".format(
            doc.get("architectures"), doc.get("model_type")
        ),
        _config_evidence(doc),
    )
    return parsed, doc


def _check_leftovers_and_links(real: str, subject: str) -> List[Dict[str, Any]]:
    """SB208: no leftovers of an unfinished download; SB209: every link resolves."""
    out: List[Dict[str, Any]] = []
    leftovers, dangling, n_links, walk_capped = _walk(real)
    leftovers = leftovers + _hf_blob_leftovers(real)
    cap_note = (
        " (stopped after {} entries: the directory is far larger than a model)".format(
            WALK_MAX_ENTRIES
        )
        if walk_capped
        else ""
    )
    if leftovers:
        out.append(
            finding(
                "SB208",
                FAIL,
                subject,
                "{} leftover(s) of an unfinished download: {}{}".format(
                    len(leftovers), _listing(leftovers), cap_note
                ),
                {"leftovers": leftovers},
            )
        )
    else:
        out.append(
            finding(
                "SB208",
                WARN if walk_capped else PASS,
                subject,
                "no *.incomplete, *.part, *.tmp or lock files" + cap_note,
            )
        )
    hf_repo = hf_cache_repo(real)
    if dangling:
        out.append(
            finding(
                "SB209",
                FAIL,
                subject,
                "{} of {} link(s) point at nothing: {}".format(
                    len(dangling),
                    n_links,
                    _listing(["{} -> {}".format(a, b) for a, b in dangling]),
                ),
                {"dangling": [{"link": a, "target": b} for a, b in dangling], "hf_repo": hf_repo},
            )
        )
    else:
        layout = " (Hugging Face cache snapshot of {})".format(hf_repo) if hf_repo else ""
        out.append(
            finding(
                "SB209",
                PASS,
                subject,
                "{} link(s), all resolve{}".format(n_links, layout),
                {"links": n_links, "hf_repo": hf_repo},
            )
        )
    return out


def _config_evidence(doc: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "architectures": doc.get("architectures"),
        "_name_or_path": doc.get("_name_or_path"),
        "model_type": doc.get("model_type"),
    }


def no_directory(path: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Why ``path`` is no directory to probe at all (absent, a dangling link, a file or a
    device), with its evidence; None when it is a directory.  On a node that is SB201's
    failing verdict; given to ``servebook probe`` on the command line it is unusable input."""
    if not os.path.lexists(path):
        return _absent_message(path), {"path": path}
    if os.path.islink(path) and not os.path.exists(path):
        target = os.readlink(path)
        return "is a link to {}, which does not exist".format(target), {
            "path": path,
            "target": target,
        }
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        kind = "a file" if os.path.isfile(real) else "a device or other special file"
        return (
            "is {}, not a directory: give the directory that holds config.json".format(kind),
            {"path": path, "real_path": real},
        )
    return None


def _check_exists(path: str, subject: str) -> Dict[str, Any]:
    gone = no_directory(path)
    if gone is not None:
        return finding("SB201", FAIL, subject, gone[0], gone[1])
    real = os.path.realpath(path)
    try:
        names = os.listdir(real)
    except OSError as e:
        return finding(
            "SB201",
            FAIL,
            subject,
            "cannot be listed: {}".format(e.strerror),
            {"path": path, "real_path": real},
        )
    if not names:
        return finding(
            "SB201",
            FAIL,
            subject,
            "is an empty directory (0 entries): nothing else checked",
            {"path": path, "real_path": real, "entries": 0},
        )
    via = "" if real == os.path.abspath(path) else " (resolved to {})".format(real)
    return finding(
        "SB201",
        PASS,
        subject,
        "directory with {} entries{}".format(len(names), via),
        {"path": path, "real_path": real, "entries": len(names)},
    )


def _absent_message(path: str) -> str:
    """Name the deepest ancestor that exists and, for a likely typo, its close matches."""
    msg = "does not exist: nothing else checked"
    parent = os.path.dirname(os.path.abspath(path))
    missing = os.path.basename(os.path.abspath(path))
    while parent and not os.path.isdir(parent):
        missing = os.path.basename(parent)
        nxt = os.path.dirname(parent)
        if nxt == parent:
            break
        parent = nxt
    try:
        siblings = sorted(os.listdir(parent))
    except OSError:
        return msg
    close = difflib.get_close_matches(missing, siblings, n=3, cutoff=0.6)
    msg += "; {} exists".format(parent)
    if close:
        msg += ", did you mean {}?".format(" or ".join(os.path.join(parent, c) for c in close))
    return msg


def _check_expect(
    expect: str, config: Optional[Dict[str, Any]], real: str, subject: str
) -> Dict[str, Any]:
    if config is None:
        return finding(
            "SB203",
            FAIL,
            subject,
            "cannot tell whether this is {}: no readable config.json (see SB202)".format(expect),
            {"expected": expect},
        )
    ok, why = _expect_model_matches(expect, config, real)
    ev = dict(_config_evidence(config), expected=expect, hf_repo=hf_cache_repo(real))
    if ok:
        return finding("SB203", PASS, subject, "is {}: {}".format(expect, why), ev)
    return finding(
        "SB203",
        FAIL,
        subject,
        "config.json is not {}: architectures {}, _name_or_path {!r}, model_type {!r}".format(
            expect,
            config.get("architectures"),
            config.get("_name_or_path"),
            config.get("model_type"),
        ),
        ev,
    )


def _is_weight_name(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or bool(_BIN_WEIGHTS.match(name))


def _check_weights(real: str, entries: List[_Entry], subject: str) -> List[Dict[str, Any]]:
    """SB204-SB207: the weight files are there, whole and match their indexes."""
    out: List[Dict[str, Any]] = []
    by_name = {e.name: e for e in entries}
    indexes = [e for e in entries if e.name.endswith(INDEX_SUFFIXES)]
    index_docs, named_by_index = _read_indexes(indexes)
    # Weight files: *.safetensors, *.gguf, pytorch_model*.bin, and whatever an index names
    # (a .bin index may name files the pattern misses).
    weights = [e for e in entries if _is_weight_name(e.name) or e.name in named_by_index]
    present = [e for e in weights if e.exists and e.is_file]

    # SB204
    out.append(_check_present(present, named_by_index, real, subject))

    # SB206 first (SB205 and SB207 use the parsed headers).
    st_infos, damaged = _inspect_weights(present)

    # SB205: the index (and the -0000i-of-0000n naming) against what is there.
    index_problems, missing_files, missing_tensors = _index_gaps(
        index_docs, by_name, st_infos, present
    )
    if index_problems or missing_files or missing_tensors:
        out.append(
            _index_gaps_finding(
                index_problems,
                missing_files,
                missing_tensors,
                named_by_index,
                by_name,
                subject,
            )
        )
    elif indexes:
        unread = [n for n in named_by_index if n in damaged]
        out.append(
            finding(
                "SB205",
                PASS,
                subject,
                "all {} shard(s) named by {} present, {}".format(
                    len(named_by_index),
                    ", ".join(ix.name for ix in indexes),
                    "every indexed tensor in its shard"
                    if not unread
                    else "tensors not checked in {} damaged shard(s) (see SB206)".format(
                        len(unread)
                    ),
                ),
                {"indexed_shards": len(named_by_index)},
            )
        )

    # SB206
    if damaged or present:
        out.append(_check_damaged(damaged, present, subject))

    # SB207: total_size of each safetensors index against the tensors its shards hold.
    for ix_name in sorted(index_docs):
        doc, problem = index_docs[ix_name]
        if problem or not ix_name.endswith(".safetensors.index.json"):
            continue
        out.append(_check_total_size(ix_name, doc, st_infos, subject))
    return out


def _read_indexes(indexes: List[_Entry]) -> Tuple[Dict[str, Tuple[Any, str]], Set[str]]:
    """Each index file's parsed document and problem (no ``weight_map`` object is one), by
    name, and every file the readable ones name."""
    index_docs: Dict[str, Tuple[Any, str]] = {}
    named_by_index: Set[str] = set()
    for ix in indexes:
        doc, problem = _read_json_file(ix.path)
        if not problem and not (isinstance(doc, dict) and isinstance(doc.get("weight_map"), dict)):
            problem = "has no weight_map object"
        index_docs[ix.name] = (doc, problem)
        if not problem:
            named_by_index.update(str(v) for v in doc["weight_map"].values())
    return index_docs, named_by_index


def _check_present(
    present: List[_Entry], named_by_index: Set[str], real: str, subject: str
) -> Dict[str, Any]:
    """SB204: there are weight files, and not all of them empty."""
    if not present:
        msg = "no weight files (*.safetensors, pytorch_model*.bin, *.gguf)"
        if named_by_index:
            msg += " although the index names {}".format(len(named_by_index))
        return finding("SB204", FAIL, subject, msg, {"directory": real})
    total = sum(e.size for e in present)
    ev = {"files": [e.name for e in present], "bytes": total}
    if total == 0:
        msg = "{} weight file(s), all empty (0 bytes)".format(len(present))
        return finding("SB204", FAIL, subject, msg, ev)
    msg = "{} weight file(s), {}".format(len(present), _human_bytes(total))
    return finding("SB204", PASS, subject, msg, ev)


def _inspect_weights(
    present: List[_Entry],
) -> Tuple[Dict[str, SafetensorsInfo], Dict[str, str]]:
    """Each safetensors file's parsed header, by name, and what is wrong with each damaged
    weight file (safetensors, GGUF or a zip-format .bin)."""
    st_infos: Dict[str, SafetensorsInfo] = {}
    damaged: Dict[str, str] = {}
    for e in present:
        if e.name.endswith(".safetensors"):
            info = inspect_safetensors(e.path)
            st_infos[e.name] = info
            problem = info.problem
        elif e.name.endswith(".gguf"):
            problem = _gguf_problem(e.path)
        else:
            problem = _zip_problem(e.path)
        if problem:
            damaged[e.name] = problem
    return st_infos, damaged


def _index_gaps(
    index_docs: Dict[str, Tuple[Any, str]],
    by_name: Dict[str, _Entry],
    st_infos: Dict[str, SafetensorsInfo],
    present: List[_Entry],
) -> Tuple[List[str], List[str], List[str]]:
    """What the indexes (and the shard naming) name that is not there: unreadable indexes,
    missing shard files (sorted), and indexed tensors absent from a readable shard."""
    missing_files: List[str] = []
    missing_tensors: List[str] = []
    index_problems: List[str] = []
    for ix_name in sorted(index_docs):
        doc, problem = index_docs[ix_name]
        if problem:
            index_problems.append("{}: {}".format(ix_name, problem))
            continue
        for tensor, shard in sorted(doc["weight_map"].items()):
            shard_entry = by_name.get(str(shard))
            if shard_entry is None or not (shard_entry.exists and shard_entry.is_file):
                if shard not in missing_files:
                    missing_files.append(str(shard))
                continue
            shard_info = st_infos.get(str(shard))
            if shard_info and not shard_info.problem and tensor not in shard_info.tensors:
                missing_tensors.append("{} (in {})".format(tensor, shard))
    for name in _missing_by_shard_name([e.name for e in present]):
        if name not in missing_files:
            missing_files.append(name)
    missing_files.sort()
    return index_problems, missing_files, missing_tensors


def _index_gaps_finding(
    index_problems: List[str],
    missing_files: List[str],
    missing_tensors: List[str],
    named_by_index: Set[str],
    by_name: Dict[str, _Entry],
    subject: str,
) -> Dict[str, Any]:
    """SB205 failed: the index problems, missing shards and absent tensors, in one finding."""
    parts = []
    if index_problems:
        parts.append("; ".join(index_problems))
    if missing_files:
        parts.append(
            "{} named shard(s) missing: {}".format(len(missing_files), _listing(missing_files))
        )
    if missing_tensors:
        parts.append(
            "{} indexed tensor(s) absent from their shard: {}".format(
                len(missing_tensors), _listing(missing_tensors, 3)
            )
        )
    return finding(
        "SB205",
        FAIL,
        subject,
        "; ".join(parts),
        {
            "index_problems": index_problems,
            "missing_shards": missing_files,
            "missing_tensors": missing_tensors,
            "present_shards": len([n for n in named_by_index if n in by_name]),
            "indexed_shards": len(named_by_index),
        },
    )


def _check_damaged(damaged: Dict[str, str], present: List[_Entry], subject: str) -> Dict[str, Any]:
    """SB206: every weight file's header parses and its size matches (a sample of its data
    is not a hole)."""
    if damaged:
        names = sorted(damaged)
        return finding(
            "SB206",
            FAIL,
            subject,
            "{} of {} weight file(s) damaged: {}".format(
                len(names),
                len(present),
                _listing(["{}: {}".format(n, damaged[n]) for n in names], 3),
            ),
            {"damaged": damaged, "checked": len(present)},
        )
    return finding(
        "SB206",
        PASS,
        subject,
        "{} weight file(s): headers parse and sizes match".format(len(present)),
        {"checked": len(present)},
    )


def _missing_by_shard_name(names: List[str]) -> List[str]:
    """Shards missing by the ``-0000i-of-0000n`` convention (catches a sharded set whose
    index is absent too)."""
    groups: Dict[Tuple[str, str, str, str], Set[int]] = {}
    for name in names:
        m = _SHARD_NAME.match(name)
        if m:
            key = (m.group("stem"), m.group("n"), m.group("ext"), str(len(m.group("i"))))
            groups.setdefault(key, set()).add(int(m.group("i")))
    missing: List[str] = []
    for (stem, n, ext, width), have in groups.items():
        for i in range(1, int(n) + 1):
            if i not in have:
                missing.append("{}-{}-of-{}.{}".format(stem, str(i).zfill(int(width)), n, ext))
    return missing


def _check_total_size(
    ix_name: str, doc: Dict[str, Any], st_infos: Dict[str, SafetensorsInfo], subject: str
) -> Dict[str, Any]:
    meta = doc.get("metadata")
    raw = meta.get("total_size") if isinstance(meta, dict) else None
    if not isinstance(raw, (int, float)) or isinstance(raw, bool) or not float(raw).is_integer():
        return finding(
            "SB207", INFO, subject, "{} has no metadata.total_size to compare".format(ix_name)
        )
    shards = sorted(set(str(v) for v in doc["weight_map"].values()))
    unusable = [s for s in shards if s not in st_infos or st_infos[s].problem]
    if unusable:
        return finding(
            "SB207",
            INFO,
            subject,
            "not compared: {} of {} shard(s) missing or damaged (see SB205, SB206)".format(
                len(unusable), len(shards)
            ),
        )
    declared = int(raw)
    actual = sum(sum(st_infos[s].tensors.values()) for s in shards)
    ev = {"index": ix_name, "total_size": declared, "tensor_bytes": actual}
    if declared == actual:
        return finding(
            "SB207",
            PASS,
            subject,
            "{} total_size {} equals the tensors' {} bytes".format(ix_name, declared, actual),
            ev,
        )
    return finding(
        "SB207",
        FAIL,
        subject,
        "{} says total_size {} but its {} shard(s) hold {} bytes of tensors ({:+d})".format(
            ix_name, declared, len(shards), actual, actual - declared
        ),
        ev,
    )


_TOKENIZER_SETS = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("tekken.json",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
)


def _check_tokenizer(by_name: Dict[str, _Entry], role: str, subject: str) -> Dict[str, Any]:
    def usable(name: str) -> bool:
        e = by_name.get(name)
        return e is not None and e.exists and e.is_file and e.size > 0

    tok = by_name.get("tokenizer.json")
    if tok is not None and usable("tokenizer.json"):
        _, problem = _read_json_file(tok.path, TOKENIZER_JSON_MAX_BYTES)
        if problem:
            return finding("SB210", FAIL, subject, "tokenizer.json: {}".format(problem))
    for files in _TOKENIZER_SETS:
        if all(usable(f) for f in files):
            return finding(
                "SB210", PASS, subject, "tokenizer: {}".format(" + ".join(files)), {"files": files}
            )
    tiktoken = sorted(n for n in by_name if n.endswith(".tiktoken") and usable(n))
    if tiktoken:
        return finding("SB210", PASS, subject, "tokenizer: {}".format(tiktoken[0]))
    if role == "draft":
        return finding(
            "SB210",
            INFO,
            subject,
            "no tokenizer: a draft model uses its target's tokenizer",
        )

    def why_not(e: _Entry) -> str:
        return "dangling" if not e.exists else "not a regular file" if not e.is_file else "empty"

    broken = sorted(f for files in _TOKENIZER_SETS for f in files if f in by_name and not usable(f))
    msg = "no tokenizer (tokenizer.json, tokenizer.model, or vocab.json + merges.txt)"
    if broken:
        msg += "; present but unusable: {}".format(
            ", ".join("{} ({})".format(f, why_not(by_name[f])) for f in broken)
        )
    return finding("SB210", FAIL, subject, msg)


def _check_mounts(
    real: str,
    weight_paths: List[str],
    mounts: Optional[List[Mount]],
    mount_error: str,
    subject: str,
) -> List[Dict[str, Any]]:
    if mounts is None:
        return [
            finding(
                "SB211",
                ERROR,
                subject,
                "cannot tell which filesystem holds {}: {}".format(real, mount_error),
                hint="Run on Linux, or pass --mountinfo FILE captured from the node "
                "(`cat /proc/self/mountinfo`).",
            )
        ]
    own = mount_for(real, mounts)
    if own is None:
        return [
            finding(
                "SB211",
                ERROR,
                subject,
                "no mount in the mountinfo contains {} (not even /)".format(real),
                hint="Pass the node's full /proc/self/mountinfo with --mountinfo.",
            )
        ]
    out = [_mount_finding(own, real, subject, "")]
    # Weight files may be links onto another mount (a Hugging Face cache whose blobs sit
    # on NFS): the engine reads from there, so that mount is judged too.
    elsewhere: Dict[int, Tuple[Mount, List[str]]] = {}
    for p in weight_paths:
        rp = os.path.realpath(p)
        m = mount_for(rp, mounts)
        if m is not None and m.line != own.line:
            elsewhere.setdefault(m.line, (m, []))[1].append(os.path.basename(p))
    for line in sorted(elsewhere):
        m, names = elsewhere[line]
        out.append(
            _mount_finding(
                m,
                real,
                subject,
                "{} weight file(s) ({}) resolve through links onto another mount: ".format(
                    len(names), _listing(names, 3)
                ),
            )
        )
    return out


def _mount_finding(m: Mount, real: str, subject: str, prefix: str) -> Dict[str, Any]:
    severity, what = classify_fs(m.fstype, m.source)
    ev = {
        "real_path": real,
        "mount_point": m.mount_point,
        "fstype": m.fstype,
        "source": m.source,
        "mount_root": m.root,
        "mountinfo_line": m.line,
    }
    where = "{}mount {} ({} from {})".format(prefix, m.mount_point, m.fstype, m.source)
    if severity == FAIL:
        msg = "{}: {}; weights load often 10x slower than from local disk and can pass the "
        msg += "ready timeout"
        msg = msg.format(where, what)
    elif severity == WARN:
        msg = "{}: {}; cannot tell whether weights load at local-disk speed".format(where, what)
    else:
        msg = "{}: {}".format(where, what)
    return finding("SB211", severity, subject, msg, ev)


# --- entry points --------------------------------------------------------------------------


def read_mountinfo(path: Optional[str]) -> Tuple[Optional[List[Mount]], str]:
    """(mounts, problem) from ``path`` (default: this process's mountinfo)."""
    src = path or PROC_MOUNTINFO
    raw, problem = _read_regular(src, MOUNTINFO_MAX_BYTES)
    if raw is None:
        return None, "cannot read {}: {}".format(src, problem)
    mounts = parse_mountinfo(raw.decode("utf-8", "surrogateescape"))
    if not mounts:
        return None, "{} holds no mountinfo lines".format(src)
    return mounts, ""


def probe(
    path: str,
    expect_model: Optional[str] = None,
    draft: Optional[str] = None,
    mounts: Optional[List[Mount]] = None,
    mount_error: str = "",
) -> List[Dict[str, Any]]:
    """All findings for a model directory and, with ``draft``, its draft model."""
    findings = check_directory(path, "model", expect_model, mounts, mount_error)
    if draft is not None:
        findings += check_directory(draft, "draft", None, mounts, mount_error)
    return findings


class FindResult(NamedTuple):
    findings: List[Dict[str, Any]]
    candidates: List[Dict[str, Any]]
    search: Dict[str, Any]


# Pseudo filesystems a search from / must not wander into.
_SKIP_FIND_REAL = {"/proc", "/sys", "/dev"}


def _looks_like_model(entries: List[_Entry]) -> bool:
    names = {e.name for e in entries}
    if "config.json" not in names:
        return False
    return any(_is_weight_name(n) or n.endswith(INDEX_SUFFIXES) for n in names)


def find_models(
    root: str,
    max_depth: int = 4,
    timeout_s: float = 10.0,
    mounts: Optional[List[Mount]] = None,
    mount_error: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> FindResult:
    """Candidate model directories (config.json plus weights) under ``root``, each probed,
    within ``max_depth`` levels and ``timeout_s`` seconds of wall time (searching and
    probing together).  Hitting either bound is reported (SB213), never silent."""
    start = clock()
    deadline = start + timeout_s
    search: Dict[str, Any] = {
        "root": root,
        "max_depth": max_depth,
        "timeout_s": timeout_s,
        "dirs_scanned": 0,
        "depth_limit_hit": False,
        "dirs_beyond_depth": 0,
        "time_limit_hit": False,
        "dirs_not_scanned": 0,
        "candidates_not_probed": 0,
        "elapsed_s": 0.0,
    }
    first = _check_exists(root, root)
    if _failed(first):
        msg = "search root {}".format(first["message"])
        f = finding("SB212", FAIL, root, msg, first["evidence"])
        search["elapsed_s"] = round(clock() - start, 3)
        return FindResult([f], [], search)

    found, beyond_examples = _search(root, max_depth, deadline, clock, search)
    findings: List[Dict[str, Any]] = []
    candidates: List[Dict[str, Any]] = []
    for i, d in enumerate(found):
        if clock() > deadline:
            search["time_limit_hit"] = True
            search["candidates_not_probed"] = len(found) - i
            for rest in found[i:]:
                candidates.append(
                    {"path": rest, "complete": None, "failing": [], "summary": "not probed"}
                )
                findings.append(
                    finding(
                        "SB212",
                        WARN,
                        rest,
                        "found but not probed: the time bound was hit first",
                        hint="`servebook probe {}` checks it alone.".format(rest),
                    )
                )
            break
        candidate, verdict = _probe_candidate(d, mounts, mount_error)
        candidates.append(candidate)
        findings.append(verdict)
    passing = [c for c in candidates if c["complete"] and not c["failing"]]
    if not found:
        findings.append(
            finding(
                "SB212",
                FAIL,
                root,
                "no model directory (config.json plus weights) found under {}".format(root),
            )
        )
    elif not passing:
        findings.append(
            finding(
                "SB212",
                FAIL,
                root,
                "none of the {} candidate(s) under {} passes every probe check".format(
                    len(found), root
                ),
            )
        )
    search["elapsed_s"] = round(clock() - start, 3)
    findings.append(_bounds_finding(search, beyond_examples))
    return FindResult(findings, candidates, search)


def _search(
    root: str,
    max_depth: int,
    deadline: float,
    clock: Callable[[], float],
    search: Dict[str, Any],
) -> Tuple[List[str], List[str]]:
    """The directories under ``root`` that look like a model, breadth first, within
    ``max_depth`` levels and until ``deadline``; a few of the directories beyond the depth
    as examples.  What it scanned and which bound it hit go into ``search``."""
    found: List[str] = []
    visited: Set[str] = set()
    beyond_examples: List[str] = []
    queue: Deque[Tuple[str, int]] = deque([(root, 0)])
    while queue:
        if clock() > deadline:
            search["time_limit_hit"] = True
            search["dirs_not_scanned"] = len(queue)
            break
        d, depth = queue.popleft()
        real = os.path.realpath(d)
        if real in visited or real in _SKIP_FIND_REAL:
            continue
        visited.add(real)
        try:
            entries = _scan(d)
        except OSError:
            continue
        search["dirs_scanned"] += 1
        if _looks_like_model(entries):
            found.append(d)
        subdirs = [e for e in entries if e.is_dir and e.name not in _SKIP_WALK]
        if depth < max_depth:
            queue.extend((e.path, depth + 1) for e in subdirs)
        elif subdirs:
            search["depth_limit_hit"] = True
            search["dirs_beyond_depth"] += len(subdirs)
            beyond_examples.extend(e.path for e in subdirs[: max(0, 3 - len(beyond_examples))])
    return found, beyond_examples


def _probe_candidate(
    d: str, mounts: Optional[List[Mount]], mount_error: str
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """One candidate directory probed: its entry in the candidates list and its SB212
    finding (a warning naming the first failing checks, else a pass)."""
    fs = _checked(d, mounts, mount_error)
    failing = [f for f in fs if _failed(f) or f["severity"] == WARN]
    completeness = [f for f in failing if f["check"] != "SB211"]
    summary = _candidate_summary(fs)
    candidate = {
        "path": d,
        "complete": not completeness,
        "failing": [f["check"] for f in failing],
        "summary": summary,
    }
    ev = {"failing": [{"check": f["check"], "message": f["message"]} for f in failing]}
    if not failing:
        return candidate, finding("SB212", PASS, d, summary, ev)
    return candidate, finding(
        "SB212",
        WARN,
        d,
        "{}; {}".format(
            summary,
            "; ".join("{} {}".format(f["check"], f["message"]) for f in failing[:3]),
        ),
        ev,
        hint="`servebook probe {}` shows every check.".format(d),
    )


def _checked(d: str, mounts: Optional[List[Mount]], mount_error: str) -> List[Dict[str, Any]]:
    """``check_directory`` of one candidate; one that cannot be checked at all is reported as
    such (SB201, error), and the search goes on to the others."""
    try:
        return check_directory(d, "model", None, mounts, mount_error)
    except Exception as e:  # one odd directory must not end the whole search
        msg = "could not be checked: {}: {}".format(type(e).__name__, str(e)[:200])
        return [finding("SB201", ERROR, d, msg, {"error": type(e).__name__})]


def _candidate_summary(fs: List[Dict[str, Any]]) -> str:
    by: Dict[str, Dict[str, Any]] = {}
    for f in fs:
        by.setdefault(f["check"], f)
    completeness_bad = [
        f["check"] for f in fs if f["check"] != "SB211" and (_failed(f) or f["severity"] == WARN)
    ]
    verdict = "complete" if not completeness_bad else "incomplete"
    parts = [verdict]
    weights = by.get("SB204")
    if weights is not None and weights["severity"] == PASS:
        parts.append(weights["message"])
    cfg = by.get("SB202")
    if cfg is not None and cfg["severity"] == PASS:
        archs = cfg["evidence"].get("architectures")
        if archs:
            parts.append("/".join(str(a) for a in archs))
    mnt = by.get("SB211")
    if mnt is not None and mnt["evidence"]:
        parts.append("{} on {}".format(mnt["evidence"]["fstype"], mnt["evidence"]["mount_point"]))
    return ", ".join(parts)


def _bounds_finding(search: Dict[str, Any], beyond: List[str]) -> Dict[str, Any]:
    scanned = "searched {} director{} in {:.2f} s".format(
        search["dirs_scanned"], "y" if search["dirs_scanned"] == 1 else "ies", search["elapsed_s"]
    )
    notes = []
    if search["depth_limit_hit"]:
        notes.append(
            "depth bound {} hit: {} director{} below it not entered (e.g. {})".format(
                search["max_depth"],
                search["dirs_beyond_depth"],
                "y" if search["dirs_beyond_depth"] == 1 else "ies",
                ", ".join(beyond),
            )
        )
    if search["time_limit_hit"]:
        notes.append(
            "time bound {} s hit: {} director{} not searched, {} candidate(s) not probed".format(
                search["timeout_s"],
                search["dirs_not_scanned"],
                "y" if search["dirs_not_scanned"] == 1 else "ies",
                search["candidates_not_probed"],
            )
        )
    if notes:
        return finding(
            "SB213", WARN, search["root"], "{}; {}".format(scanned, "; ".join(notes)), search
        )
    return finding(
        "SB213",
        PASS,
        search["root"],
        "{}, the whole tree within depth {}".format(scanned, search["max_depth"]),
        search,
    )


def to_document(findings: List[Dict[str, Any]], **extra: Any) -> Dict[str, Any]:
    """The JSON document ``--json`` prints: the shape of ``servebook.findings.to_json``."""
    doc: Dict[str, Any] = {
        "ok": exit_code(findings) == 0,
        "exit_code": exit_code(findings),
        "findings": findings,
    }
    doc.update(extra)
    return doc


def _print_text(findings: List[Dict[str, Any]]) -> None:
    for f in findings:
        print(
            "{:<5} {} {}: {}".format(f["severity"].upper(), f["check"], f["subject"], f["message"])
        )
        if f["hint"]:
            print("      fix: {}".format(f["hint"]))
    n_fail = sum(1 for f in findings if _failed(f))
    print("{} finding(s): {} failing".format(len(findings), n_fail))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="probe.py",
        description="Read-only check of a model directory on this node: exists, config.json "
        "is the expected model, weights complete and intact, tokenizer present, on a local "
        "filesystem.  Exit 0 all pass, 1 a check failed, 2 unusable arguments or undecidable.",
        epilog="example: python3 probe.py /mnt/models/llama --expect-model LlamaForCausalLM "
        "--json;  python3 probe.py --find /mnt --json",
    )
    parser.add_argument("dir", nargs="?", help="the model directory")
    parser.add_argument("--expect-model", metavar="M", help="an architecture or model name")
    parser.add_argument("--draft", metavar="DIR2", help="a draft model directory, checked too")
    parser.add_argument(
        "--mountinfo", metavar="FILE", help="read mounts from FILE, not /proc/self/mountinfo"
    )
    parser.add_argument("--find", metavar="ROOT", help="list model directories under ROOT")
    parser.add_argument("--max-depth", type=int, default=None, help="--find depth (default 4)")
    parser.add_argument("--timeout", type=float, default=None, help="--find seconds (default 10)")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    args = parser.parse_args(argv)
    problem = usage_problem(
        args.dir, args.find, args.expect_model, args.draft, args.max_depth, args.timeout
    )
    if problem:
        parser.error(problem)  # exits 2
    mounts, mount_error = read_mountinfo(args.mountinfo)
    if args.mountinfo and mounts is None:
        parser.error(mount_error)
    extra: Dict[str, Any] = {"probe": {"version": PROBE_VERSION, "python": sys.version.split()[0]}}
    if args.find:
        res = find_models(
            args.find,
            4 if args.max_depth is None else args.max_depth,
            10.0 if args.timeout is None else args.timeout,
            mounts,
            mount_error,
        )
        findings = res.findings
        extra.update(candidates=res.candidates, search=res.search)
    else:
        findings = probe(args.dir, args.expect_model, args.draft, mounts, mount_error)
    if args.json:
        print(json.dumps(to_document(findings, **extra), indent=2, default=str))
    else:
        _print_text(findings)
    return exit_code(findings)


def usage_problem(
    directory: Optional[str],
    find: Optional[str],
    expect_model: Optional[str],
    draft: Optional[str],
    max_depth: Optional[int],
    timeout: Optional[float],
) -> str:
    """Why this combination of arguments is unusable, or ''."""
    if directory and find:
        return "give either DIR or --find ROOT, not both"
    if not directory and not find:
        return "give a model directory DIR, or --find ROOT to list model directories"
    if find and (expect_model or draft):
        return "--expect-model and --draft apply to DIR, not to --find"
    if not find and (max_depth is not None or timeout is not None):
        return "--max-depth and --timeout apply to --find only"
    if max_depth is not None and max_depth < 0:
        return "--max-depth must be 0 or more"
    if timeout is not None and not timeout > 0:
        return "--timeout must be more than 0 seconds"
    return ""


if __name__ == "__main__":
    sys.exit(main())
