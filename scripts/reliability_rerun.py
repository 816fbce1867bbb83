"""Re-run the reliability probe of 2026-12-04 (issue 33) against the servebook of this
checkout, and count: cases tried, held, failed, and not re-run (with why).

The probe's file (shared/reference/reliability-probe-2026-12-04.md) holds 345 cases in the
tables of its four sections and its piped-output table; a row marked ``(N)`` is N cases.
Here each row is one function that builds the row's input in a temporary directory (with
a temporary SERVEBOOK_HOME), runs the real CLI in a child process bounded in time
(``timeout``, never past 30 s) and memory, and judges the outcome by the row's "expected"
column: the exit code, the file or key the message names, no traceback, no hang, no
secret in any output.  A row returns one verdict per case it counts: ``None`` (held), a
text (failed: what was observed) or ``Skip(why)`` (not re-run).

The probe's outside instruments are replaced by the project's own: its fault server by
the scripted stand-in engine (tests/unit/engine_standin.py), a full disk by a file-size
limit (EFBIG where a full disk gives ENOSPC), mode-000 files read by root by dropping
root's DAC capabilities (setpriv).  By default nothing here starts vLLM or reaches past
loopback, and no command runs past 30 s: the cases that need a real engine are not re-run,
and say so.

``--engines`` re-runs them too, with real vLLM CPU engines of the tiny recipes (tiny-mixed,
one engine; tiny-pd for its own row): interrupts of ``up`` and ``run`` while an engine
starts or a sweep runs, two ``up`` of one name at once, ``up --timeout 5`` on tiny-pd, and
what vLLM's own log keeps of an API key.  Each such case has its own SERVEBOOK_HOME, a
command bound of ``ENGINE_BOUND_S``, and stops exactly what it started: the process groups
its servebook commands made (seen while they ran) and ``servebook down NAME``.  It waits
first (``--engine-wait``) until at most one other vLLM server group runs on the machine.
``--engines`` (or ``--slow``) also gives the 50 MB lint ``LONG_BOUND_S`` instead of 30 s.

    PYTHONPATH=src .venv/bin/python scripts/reliability_rerun.py [--json] [-k TEXT]
    PYTHONPATH=src .venv/bin/python scripts/reliability_rerun.py --engines --only-gated

Exit 0: no case failed; 1: a case failed; 2: bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests.unit.engine_standin: the scripted engine
    sys.path.insert(0, str(REPO))

FIX = REPO / "tests" / "unit" / "fixtures"
GOOD_VALUES = FIX / "render" / "vllm-pd" / "values.yaml"
HEALTHY = FIX / "preflight" / "healthy.json"
RESULTS = FIX / "results" / "tiny-pd-spec-cpu"
MOUNTINFO = FIX / "probe" / "pod-probe-hostpath-local.mountinfo"
TINY_MIXED = REPO / "src" / "servebook" / "recipe" / "catalog" / "tiny-mixed.yaml"
# preflight vllm-pd on the fixtures' GPU nodes gpu-a and gpu-b (tests/conftest.py's GPU_PD_SETS)
PD_SETS = [
    "image=vllm/vllm-openai:v0.11.0",
    "prefill_node=gpu-a",
    "decode_node=gpu-b",
    "prefill_model_dir=/models/llama",
    "decode_model_dir=/models/llama",
    "fabric=tcp",
    "allow_tcp_kv=true",
]
# A child that reads without a bound stops here (MemoryError) instead of taking the machine.
MEMORY_BOUND = [
    "import resource",
    "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))",
]
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
BOUND_S = 30.0  # no case runs a command longer (by default)
LONG_BOUND_S = 300.0  # with --slow or --engines, a case marked long (the 50 MB lint)
ENGINE_BOUND_S = 420.0  # with --engines, one command of an engine case
STARTING_S = 8.0  # an engine case signals `up` this long after its engine started
ENGINE_UP_S = 240  # `up --timeout` of an engine case: tiny-mixed is ready in 30-120 s here
ENGINES_WHY = "re-run with --engines (real vLLM engines, about a minute each on 2 cores)"
_UP = (
    "needs `up`/`run` of a real vLLM engine: " + ENGINES_WHY + "; "
    "tests/unit/test_interrupt.py plays it with the stand-in vLLM package"
)

SECTIONS = {
    "1": "Section 1: bad inputs",
    "3": "Section 3: secrets",
    "piped": "Piped output",
    "2": "Section 2: faults during runs",
    "4": "Section 4: concurrency",
}


@dataclass(frozen=True)
class Skip:
    """A case not re-run, and why."""

    why: str


Verdict = str | Skip | None  # None: held; str: failed, what was observed


@dataclass
class Case:
    section: str
    table: str
    row: str
    expected: str
    n: int
    fn: Callable[[Ctx], list[Verdict] | Verdict] | None
    why_not: str | None = None
    needs: str | None = None  # "engines": re-run only with --engines (real vLLM)
    long: bool = False  # its bound is LONG_BOUND_S with --slow or --engines


@dataclass
class Mode:
    """What this re-run may do beyond the quick default (``main``'s flags)."""

    engines: bool = False  # start real vLLM engines (the cases with needs="engines")
    slow: bool = False  # long cases get LONG_BOUND_S
    engine_wait_s: float = 900.0  # the most an engine case waits for a quiet machine


MODE = Mode()


@dataclass
class Outcome:
    case: Case
    verdicts: list[Verdict]
    seconds: float
    notes: list[str] = field(default_factory=list)  # what an engine case observed


CASES: list[Case] = []
_table: list[str] = ["", ""]


def table(section: str, name: str) -> None:
    """The table the rows declared after this belong to."""
    _table[:] = [section, name]


def case(
    row: str,
    expected: str,
    n: int = 1,
    *,
    needs: str | None = None,
    why_not: str | None = None,
    long: bool = False,
) -> Callable[[Callable[[Ctx], Any]], Callable[[Ctx], Any]]:
    """A row re-run by the function it decorates; with ``needs="engines"`` only when
    --engines is given (else not re-run, for ``why_not``)."""

    def add(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
        CASES.append(Case(_table[0], _table[1], row, expected, n, fn, why_not, needs, long))
        return fn

    return add


def not_rerun(row: str, expected: str, why: str, n: int = 1) -> None:
    CASES.append(Case(_table[0], _table[1], row, expected, n, None, why))


# --- running the CLI ---------------------------------------------------------------------


@dataclass
class Run:
    args: list[str]
    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool
    limit: float

    @property
    def text(self) -> str:
        """What it printed, Rich's wrapping undone."""
        return " ".join((self.out + self.err).split())

    def has(self, s: str) -> bool:
        """``s`` was printed, whitespace (Rich folds long paths) ignored."""
        squeeze = "".join(s.split())
        return squeeze in "".join((self.out + self.err).split())


@dataclass
class Ctx:
    """One case's temporary directory and SERVEBOOK_HOME, and the shared fixtures."""

    root: Path
    shared: Shared
    env: dict[str, str] = field(default_factory=dict)
    bound: float = BOUND_S  # no command of this case runs longer
    # run last to first when the case ends, however it ends (an engine case's clean-up)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # evidence, in --json's rows

    @property
    def home(self) -> Path:
        return self.root / "home"

    def p(self, name: str) -> Path:
        return self.root / name

    def sb(
        self,
        *args: str | Path,
        timeout: float = 20,
        env: dict[str, str] | None = None,
        no_dac: bool = False,
        prelude: Sequence[str] = (),
        columns: str | None = "200",
    ) -> Run:
        """``servebook ARGS`` in a child of its own session, killed with its children past
        ``timeout`` seconds."""
        code = "\n".join([*MEMORY_BOUND, *prelude, "from servebook.entry import main", "main()"])
        argv = [*(NO_DAC if no_dac else []), sys.executable, "-c", code, *map(str, args)]
        full = {**os.environ, "SERVEBOOK_HOME": str(self.home), **self.env, **(env or {})}
        full["PYTHONPATH"] = this_checkout(full.get("PYTHONPATH"))
        full.pop("COLUMNS", None)
        if columns is not None:
            full["COLUMNS"] = columns
        for name in ("OPENAI_API_KEY", "VLLM_API_KEY"):
            if name not in (env or {}) and name not in self.env:
                full.pop(name, None)
        return spawn(argv, full, min(timeout, self.bound), cwd=self.root)


def this_checkout(pythonpath: str | None) -> str:
    """PYTHONPATH with this checkout's src first: the servebook re-run is this one, not
    whatever the venv installed (a relative entry would not hold in a case's directory)."""
    rest = [str(Path(e).resolve()) for e in (pythonpath or "").split(os.pathsep) if e]
    return os.pathsep.join([str(REPO / "src"), *rest])


def spawn(argv: list[str], env: dict[str, str], timeout: float, cwd: Path) -> Run:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, err = proc.communicate()
    return Run(argv[3:], proc.returncode, out, err, time.monotonic() - t0, timed_out, timeout)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """The child and everything it started (its own session), nothing else."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def tb_line(r: Run) -> str:
    lines = (r.out + r.err).strip().splitlines()
    return lines[-1].strip() if lines else ""


def expect(
    r: Run,
    rc: int | Iterable[int] = 2,
    *,
    names: Iterable[str | Path] = (),
    says: Iterable[str] = (),
    not_says: Iterable[str] = (),
    secrets: Iterable[str] = (),
) -> Verdict:
    """None when ``r`` ended as expected; else what was observed."""
    if r.timed_out:
        return f"no answer within {r.limit:.0f} s (killed)"
    want = {rc} if isinstance(rc, int) else set(rc)
    problems = []
    if r.rc not in want:
        problems.append(f"exit {r.rc} (expected {'/'.join(map(str, sorted(want)))})")
    if "Traceback (most recent call last)" in r.out + r.err:
        problems.append(f"traceback ({tb_line(r)})")
    problems += [f"does not name {n}" for n in map(str, names) if not r.has(n)]
    problems += [f"does not say {s!r}" for s in says if not r.has(s)]
    problems += [f"says {s!r}" for s in not_says if r.has(s)]
    problems += [f"prints the secret {s}" for s in secrets if s in r.out + r.err]
    if not problems:
        return None
    return "; ".join(problems) + f" | {r.text[:400]}"


def first(*verdicts: Verdict) -> Verdict:
    """The first failure among checks of one case."""
    return next((v for v in verdicts if v is not None), None)


def leaks(where: Path, secret: str) -> list[str]:
    """Files under ``where`` holding ``secret`` (gzip members read as they are)."""
    import gzip

    found = []
    for f in sorted(where.rglob("*")) if where.exists() else []:
        if not f.is_file():
            continue
        data = f.read_bytes()
        if f.suffix == ".gz":
            with contextlib.suppress(OSError, EOFError):
                data = gzip.decompress(data)
        if secret.encode() in data:
            found.append(str(f.relative_to(where)))
    return found


# --- shared fixtures: the tiny model, a healthy stand-in engine, a run's results ---------


class Shared:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._stack = contextlib.ExitStack()
        self._tiny: Path | None = None
        self._engine: str | None = None
        self.seen = root / "seen"

    def close(self) -> None:
        self._stack.close()

    @property
    def tiny(self) -> Path:
        """The tiny model (4 shards, index, tokenizer), made once; cases copy it."""
        if self._tiny is None:
            from servebook.models.tiny import make_tiny_model

            self._tiny = make_tiny_model(self.root / "tiny")
        return self._tiny

    @property
    def url(self) -> str:
        """A healthy scripted engine serving ``tiny`` (the probe's refserver)."""
        if self._engine is None:
            from tests.unit.engine_standin import scripted_engine

            url, _ = self._stack.enter_context(
                scripted_engine(tokenizer=self.tiny / "tokenizer.json", seen=self.seen)
            )
            self._engine = url
        return self._engine

    def completions(self) -> int:
        return len(list(self.seen.iterdir())) if self.seen.exists() else 0


def bench_args(c: Ctx, url: str, out: Path | str, *extra: str | Path) -> list[str | Path]:
    """A short sweep against ``url`` serving ``tiny`` (the probe's Q, shortened)."""
    return [
        "bench", "--url", url, "--model", "tiny", "--tokenizer", c.shared.tiny,
        "--concurrency", "1,2", "--repetitions", "1", "--precision", "off",
        "--order", "ascending",
        "--duration", "1s", "--warmup", "2r", "--input-len", "16", "--output-len", "4",
        "--min-requests", "2", "--max-client-lag-ms", "1000",
        "--min-achieved-concurrency", "0.5", "-o", out, *extra,
    ]  # fmt: skip


def before_load(c: Ctx, r: Run, *, rc: int = 2, **kw: Any) -> Verdict:
    """``r`` (a bench against the shared engine) was refused before any request."""
    return expect(r, rc, **kw)


def refused_before_load(c: Ctx, *args: str | Path, **kw: Any) -> Verdict:
    url = c.shared.url
    n0 = c.shared.completions()
    r = c.sb(*args, timeout=kw.pop("timeout", 20))
    sent = c.shared.completions() - n0
    v = expect(r, 2, **kw)
    if v is None and sent:
        v = f"refused, but after {sent} completion(s) were sent | {r.text[:300]}"
    del url
    return v


def alias_bomb(levels: int, indent: str = "  ") -> str:
    lines = [f"{indent}a: &a [x, x, x, x, x, x, x, x, x, x]"]
    prev = "a"
    for i in range(levels):
        lines.append(f"{indent}l{i}: &l{i} [" + ", ".join([f"*{prev}"] * 10) + "]")
        prev = f"l{i}"
    return "\n".join(lines) + "\n"


def bomb_manifest(levels: int) -> str:
    return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n" + alias_bomb(levels)


def deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def deep_yaml(depth: int = 3000) -> str:
    return "k: " + "{k: " * depth + "v" + "}" * depth + "\n"


NOT_REGULAR = "not a regular file"


def hostile(c: Ctx, kind: str, name: str) -> Path:
    """A file ``name`` of ``kind`` in the case's directory."""
    p = c.p(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero":
        p.symlink_to("/dev/zero")
    elif kind == "latin1":
        p.write_bytes(b"gpus: caf\xe9\n")
    elif kind == "binary":
        p.write_bytes(bytes(range(256)) * 4)
    elif kind == "deep-json":
        p.write_text(deep_json())
    elif kind == "deep-yaml":
        p.write_text(deep_yaml())
    else:
        raise ValueError(kind)
    return p


# =========================================================================================
# Section 1: bad inputs
# =========================================================================================

table("1", "Values files and --set (render vllm-pd -f good.yaml -f X)")


def render(c: Ctx, *extra: str | Path, timeout: float = 20) -> Run:
    return c.sb("render", "vllm-pd", "-f", GOOD_VALUES, *extra, "-o", c.p("out"), timeout=timeout)


def render_values(c: Ctx, text: str | bytes, name: str = "v.yaml") -> tuple[Run, Path]:
    p = c.p(name)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return render(c, "-f", p), p


def render_set(c: Ctx, *sets: str) -> Run:
    return render(c, *(a for s in sets for a in ("--set", s)))


@case("binary values file", "exit 2, names file")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "binary", "v.yaml")
    return expect(render(c, "-f", p), names=[p])


@case("Latin-1 values file", "exit 2")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "latin1", "v.yaml")
    return expect(render(c, "-f", p), names=[p])


@case("symlink to /dev/zero", "exit 2 (not 'does not exist')")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "dev-zero", "v.yaml")
    return expect(render(c, "-f", p), names=[p], says=[NOT_REGULAR], not_says=["does not exist"])


@case("FIFO values file", "exit 2, no hang (not 'does not exist')")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "fifo", "v.yaml")
    return expect(render(c, "-f", p), names=[p], says=["FIFO"], not_says=["does not exist"])


@case('`gpus: "two"`', "exit 2 naming key+fix")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, 'gpus: "two"\n')
    return expect(r, names=[p, "gpus", "two"])


@case("unknown key", "exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "gpuz: 2\n")
    return expect(r, names=[p, "gpuz"])


@case("duplicate key", "exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "gpus: 2\ngpus: 4\n")
    return expect(r, names=[p, "gpus"])


@case("top-level list", "exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "- gpus: 2\n")
    return expect(r, names=[p])


@case("empty file", "exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "")
    return expect(r, names=[p])


@case("malformed YAML", "exit 2 with line")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "gpus: 2\naffinity: [unclosed\n")
    return expect(r, names=[p], says=["line"])


@case("unreadable (caps dropped)", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("v.yaml")
    p.write_text("gpus: 2\n")
    p.chmod(0)
    r = c.sb("render", "vllm-pd", "-f", GOOD_VALUES, "-f", p, "-o", c.p("out"), no_dac=True)
    return expect(r, names=[p])


@case("alias bomb at top level", "fast exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, alias_bomb(9, indent=""))
    return expect(r, names=[p]) if r.seconds < 10 else f"took {r.seconds:.1f} s"


@case("alias bomb in `pod_overrides`", "fast exit 2")
def _(c: Ctx) -> Verdict:
    r, p = render_values(c, "pod_overrides:\n" + alias_bomb(9))
    return expect(r, names=[p]) if r.seconds < 10 else f"took {r.seconds:.1f} s"


@case("60 MB values file", "bounded")
def _(c: Ctx) -> Verdict:
    p = c.p("v.yaml")
    with p.open("w") as f:
        for _ in range(60):
            f.write("# padding padding padding padding padding padding padding padding\n" * 15_000)
        f.write("gpus: 1\n")
    return expect(render(c, "-f", p), names=[p])


@case("path with spaces", "works")
def _(c: Ctx) -> Verdict:
    _mkparent(c, "a dir/x")
    r, _p = render_values(c, "gpus: 8\n", name="a dir/v a.yaml")
    return expect(r, 0)


def _mkparent(c: Ctx, name: str) -> None:
    c.p(name).parent.mkdir(parents=True, exist_ok=True)


@case("path with a newline", "works")
def _(c: Ctx) -> Verdict:
    _mkparent(c, "a\ndir/x")
    r, _p = render_values(c, "gpus: 8\n", name="a\ndir/v.yaml")
    return expect(r, 0)


@case("`--set =x`, `--set gpus`", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    return [expect(render_set(c, s), says=["NAME=VALUE"]) for s in ("=x", "gpus")]


@case("`gpus==2`, `gpus=`, `-1`, `1e3`, `0x10`, `true`", "exit 2", n=6)
def _(c: Ctx) -> list[Verdict]:
    sets = ["gpus==2", "gpus=", "gpus=-1", "gpus=1e3", "gpus=0x10", "gpus=true"]
    return [expect(render_set(c, s), names=["gpus"]) for s in sets]


@case("`' gpus =2'`, `gpus=2 `, fullwidth `\uff12`", "accepted", n=3)
def _(c: Ctx) -> list[Verdict]:
    # 8: good.yaml's engines run 8 GPU workers a Pod
    return [expect(render_set(c, s), 0) for s in (" gpus =8", "gpus=8 ", "gpus=\uff18")]


@case("`max_model_len=99999999999999999999999`", "refused")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "max_model_len=99999999999999999999999"), names=["max_model_len"])


@case('`extra_engine_args="unterminated`', "exit 2")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, 'extra_engine_args="unterminated'), names=["extra_engine_args"])


@case(
    "`extra_engine_args=--model x`, `--served-model-name x`, `-tp 4`",
    "exit 2, each explained",
    n=3,
)
def _(c: Ctx) -> list[Verdict]:
    flags = [("--model x", "--model"), ("--served-model-name x", "--served-model-name")]
    flags.append(("-tp 4", "--tensor-parallel-size"))
    return [expect(render_set(c, f"extra_engine_args={f}"), names=[n]) for f, n in flags]


@case("`affinity=[unclosed`, `!!python/object/apply:os.system`, `42`", "exit 2, no code run", n=3)
def _(c: Ctx) -> list[Verdict]:
    marker = c.p("ran")
    values = ["[unclosed", f"!!python/object/apply:os.system ['touch {marker}']", "42"]
    out: list[Verdict] = []
    for v in values:
        verdict = expect(render_set(c, f"affinity={v}"), names=["affinity"])
        out.append(verdict or ("the YAML ran code" if marker.exists() else None))
    return out


@case("`namespace=../../etc`, `UPPER`; `prefill_node=a b`", "exit 2", n=3)
def _(c: Ctx) -> list[Verdict]:
    sets = [("namespace=../../etc", "namespace"), ("namespace=UPPER", "namespace")]
    sets.append(("prefill_node=a b", "prefill_node"))
    return [expect(render_set(c, s), names=[k]) for s, k in sets]


@case("`image=...:latest`", "exit 2")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "image=vllm/vllm-openai:latest"), names=["latest"])


@case("`startup_timeout_s=nan`", "exit 2")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "startup_timeout_s=nan"), names=["startup_timeout_s"])


@case("`served_name=a/b`", "accepted or refused")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "served_name=a/b"), (0, 2))


@case("`--set gpus=2 --set gpus=8`", "refuse like values file")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "gpus=2", "gpus=8"), names=["gpus"])


@case("`pod_overrides='{containers: [...]}'`", "exit 2")
def _(c: Ctx) -> Verdict:
    r = render_set(c, "pod_overrides={containers: [{name: x, image: 'busybox:1.36'}]}")
    return expect(r, names=["pod_overrides"])


@case("`--set hf_token=SECRET` (unknown)", "exit 2, value not printed")
def _(c: Ctx) -> Verdict:
    return expect(render_set(c, "hf_token=hf_SETSECRET5150"), secrets=["hf_SETSECRET5150"])


@case('`--set extra_engine_args="--api-key K"` / `=K`', "refused, K hidden", n=2)
def _(c: Ctx) -> list[Verdict]:
    k = "sk-SETKEY7788abcd"
    forms = [f"extra_engine_args=--api-key {k}", f"extra_engine_args=--api-key={k}"]
    return [expect(render_set(c, s), (1, 2), secrets=[k]) for s in forms]


table("1", "Recipe files (recipes show FILE)")


def show(c: Ctx, p: Path, **kw: Any) -> Run:
    return c.sb("recipes", "show", p, **kw)


@case("copy of tiny-mixed", "exit 0")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    shutil.copy(TINY_MIXED, p)
    return expect(show(c, p), 0)


@case("Latin-1", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    p.write_bytes(TINY_MIXED.read_bytes().replace(b"description:", b"description: caf\xe9", 1))
    return expect(show(c, p), names=[p])


@case("binary", "exit 2")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "binary", "r.yaml")
    return expect(show(c, p), names=[p])


@case("alias bomb under unknown key (5 KB)", "fast exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    p.write_text(TINY_MIXED.read_text() + "junk:\n" + alias_bomb(8))
    r = show(c, p)
    return expect(r, names=[p]) if r.seconds < 10 else f"took {r.seconds:.1f} s"


@case("50k nested lists", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    p.write_text(deep_json(50_000))
    return expect(show(c, p), names=[p])


@case("unknown top key", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    p.write_text(TINY_MIXED.read_text() + "colour: blue\n")
    return expect(show(c, p), names=["colour"])


@case("wrong type", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    p.write_text(
        "name: t\ndescription: d\nbackends: [local]\ntopology: mixed\n"
        "model: {path: /m, served_name: m, max_model_len: lots}\nroles: {mixed: {}}\n"
    )
    return expect(show(c, p), names=["max_model_len"])


@case("/dev/zero symlink", "exit 2 (not 'does not exist')")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "dev-zero", "r.yaml")
    return expect(show(c, p), names=[p], says=[NOT_REGULAR], not_says=["does not exist"])


@case("FIFO", "exit 2, no hang (not 'does not exist')")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "fifo", "r.yaml")
    return expect(show(c, p), names=[p], says=["FIFO"], not_says=["does not exist"])


@case("unreadable (caps dropped)", "exit 2")
def _(c: Ctx) -> Verdict:
    p = c.p("r.yaml")
    shutil.copy(TINY_MIXED, p)
    p.chmod(0)
    return expect(show(c, p, no_dac=True), names=[p])


table("1", "up arguments (local)")


def standin_env(c: Ctx) -> dict[str, str]:
    """The project's stand-in vLLM package first on the path: should a bad argument get past
    up's checks, what starts is the stand-in, never vLLM."""
    from tests.unit.engine_standin import vllm_package

    return vllm_package(c.p("standin"))


def up(c: Ctx, *args: str, timeout: float = 25) -> Run:
    return c.sb("up", *args, env=standin_env(c), timeout=timeout)


def nothing_recorded(c: Ctx) -> Verdict:
    found = list((c.home / "deployments").rglob("state.json"))
    if found:
        c.sb("down", found[0].parent.name, timeout=20)
    return f"a deployment was recorded: {found[0]}" if found else None


@case("`--port 70000`, `0`, `-1`", "exit 2 before start", n=3)
def _(c: Ctx) -> list[Verdict]:
    return [
        first(expect(up(c, "tiny-mixed", "--port", p), names=[p]), nothing_recorded(c))
        for p in ("70000", "0", "-1")
    ]


@case("`--port abc`", "exit 2")
def _(c: Ctx) -> Verdict:
    return first(expect(up(c, "tiny-mixed", "--port", "abc")), nothing_recorded(c))


@case("`--port 22`", "works or refused (the stand-in engine, not vLLM)")
def _(c: Ctx) -> Verdict:
    r = up(c, "tiny-mixed", "--port", "22", "--timeout", "20")
    if r.rc == 0:
        d = c.sb("down", "tiny-mixed")
        return expect(r, 0) or expect(d, 0)
    return first(expect(r, 2), nothing_recorded(c))


@case("`--timeout -1`, `0`", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    return [
        first(expect(up(c, "tiny-mixed", "--timeout", t), names=["--timeout"]), nothing_recorded(c))
        for t in ("-1", "0")
    ]


@case("`--timeout nan`", "exit 2")
def _(c: Ctx) -> Verdict:
    r = up(c, "tiny-mixed", "--timeout", "nan")
    return first(expect(r, names=["--timeout"]), nothing_recorded(c))


@case("`--name ../../victim` (tiny-pd)", "refused, victim untouched")
def _(c: Ctx) -> Verdict:
    kv = c.p("victim/kv")
    kv.mkdir(parents=True)
    (kv / "important.txt").write_text("precious\n")
    r = up(c, "tiny-pd", "--name", "../../victim", "--timeout", "5")
    lost = None if (kv / "important.txt").exists() else "victim/kv/important.txt was deleted"
    made = [str(x.name) for x in c.p("victim").iterdir() if x.name != "kv"]
    return first(
        expect(r, names=["../../victim"]),
        lost,
        f"wrote {made} into victim/" if made else None,
        nothing_recorded(c),
    )


@case("`--name a/b`, `--name .`", "refused", n=2)
def _(c: Ctx) -> list[Verdict]:
    return [
        first(expect(up(c, "tiny-mixed", "--name", n, "--timeout", "5")), nothing_recorded(c))
        for n in ("a/b", ".")
    ]


table("1", "URLs (bench --url U)")


def bench_url(c: Ctx, url: str, *extra: str, timeout: float = 25) -> Run:
    return c.sb(*bench_args(c, url, c.p("out"), *extra), timeout=timeout)


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def nothing_written(c: Ctx) -> Verdict:
    out = c.p("out")
    return f"wrote {sorted(x.name for x in out.iterdir())}" if out.exists() else None


@case("`ftp://`, `file:///etc/passwd`, leading space, `http://`", "exit 2", n=4)
def _(c: Ctx) -> list[Verdict]:
    urls = ["ftp://127.0.0.1:21", "file:///etc/passwd", " " + c.shared.url, "http://"]
    return [first(expect(bench_url(c, u)), nothing_written(c)) for u in urls]


@case("`:99999`", 'exit 2 "port out of range"')
def _(c: Ctx) -> Verdict:
    r = bench_url(c, "http://127.0.0.1:99999")
    return expect(r, says=["99999"], not_says=["Connection refused"])


@case("`:0`, `:-1`, closed port", "exit 2, nothing written", n=3)
def _(c: Ctx) -> list[Verdict]:
    from tests.unit.engine_standin import free_port

    urls = ["http://127.0.0.1:0", "http://127.0.0.1:-1", f"http://127.0.0.1:{free_port()}"]
    return [first(expect(bench_url(c, u)), nothing_written(c)) for u in urls]


@case("`:abc`", "exit 2")
def _(c: Ctx) -> Verdict:
    return first(expect(bench_url(c, "http://127.0.0.1:abc")), nothing_written(c))


@case("`http://[::1`", "exit 2")
def _(c: Ctx) -> Verdict:
    return first(expect(bench_url(c, "http://[::1")), nothing_written(c))


@case("embedded newline", "exit 2")
def _(c: Ctx) -> Verdict:
    return first(expect(bench_url(c, "http://127.0.0.1:8000/v1\nHost: x")), nothing_written(c))


@case("`HTTP://127.0.0.1:PORT`", "accepted")
def _(c: Ctx) -> Verdict:
    return expect(bench_url(c, c.shared.url.replace("http://", "HTTP://")), 0)


@case("`http://[::1]:PORT` (scripted engine on ::1)", "works, URL recorded")
def _(c: Ctx) -> Verdict:
    from tests.unit.engine_standin import scripted_engine

    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json", host="::1") as (url, _):
        r = bench_url(c, url)
    res = c.p("out/results.json")
    url_kept = res.exists() and url in res.read_text()
    return expect(r, 0) or (None if url_kept else "results.json does not record the URL")


@case("`/v1/` suffix, `localhost`", "works", n=2)
def _(c: Ctx) -> list[Verdict]:
    out = [expect(bench_url(c, c.shared.url + "/v1/"), 0)]
    shutil.rmtree(c.p("out"), ignore_errors=True)
    out.append(expect(bench_url(c, c.shared.url.replace("127.0.0.1", "localhost")), 0))
    return out


@case("`/../../etc` path", "exit 2")
def _(c: Ctx) -> Verdict:
    return expect(bench_url(c, c.shared.url + "/../../etc"))


@case("`user:pw@`", "works or refused, pw hidden")
def _(c: Ctx) -> Verdict:
    url = c.shared.url.replace("http://", "http://user:URLPW5566@")
    r = bench_url(c, url)
    return first(expect(r, (0, 2), secrets=["URLPW5566"]), leaked_under(c, "URLPW5566"))


def leaked_under(c: Ctx, secret: str) -> Verdict:
    found = leaks(c.root / "out", secret) + leaks(c.home, secret)
    return f"{secret} written to {found}" if found else None


@case("`u:p@ss@host`", "pw hidden")
def _(c: Ctx) -> Verdict:
    url = c.shared.url.replace("http://", "http://u:p@TAILSECRET99@")
    r = bench_url(c, url)
    return first(expect(r, (0, 2), secrets=["TAILSECRET99"]), leaked_under(c, "TAILSECRET99"))


@case("`?api_key=SECRET`", "hidden")
def _(c: Ctx) -> Verdict:
    r = bench_url(c, c.shared.url + "/?api_key=QUERYSECRET7711")
    v = expect(r, (0, 2), secrets=["QUERYSECRET7711"])
    return first(v, leaked_under(c, "QUERYSECRET7711"))


@case("`/v1/models` lists another model", "exit 2 naming the served one")
def _(c: Ctx) -> Verdict:
    args = bench_args(c, c.shared.url, c.p("out"))
    args[args.index("--model") + 1] = "someone-else"
    return first(expect(c.sb(*args), names=["tiny"]), nothing_written(c))


table("1", "Results directories (report, compare, bench --resume)")


def results_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((RESULTS / "results.json").read_text())
    return doc


def results_dir(c: Ctx, name: str, doc: Any = None, raw: bytes | str | None = None) -> Path:
    d = c.p(name)
    d.mkdir(parents=True, exist_ok=True)
    f = d / "results.json"
    if raw is not None:
        f.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    else:
        f.write_text(json.dumps(results_doc() if doc is None else doc))
    return d


def report(c: Ctx, *dirs: Path) -> Run:
    return c.sb("report", *dirs, "-o", c.p("rep/report.html"))


def resume(c: Ctx, d: Path) -> Run:
    args = bench_args(c, c.shared.url, d, "--resume")
    return c.sb(*args)


def redated(doc: dict[str, Any], when: str = "2027-01-02T03:04:05+00:00") -> dict[str, Any]:
    """``doc`` as another run's: new timestamps (a copy is no re-run)."""
    doc["provenance"]["started_at"] = when
    doc["provenance"]["ended_at"] = when
    for i, p in enumerate(doc["points"]):
        for k in ("started_at", "ended_at"):
            if k in p:
                p[k] = f"2027-01-02T03:{i:02d}:05+00:00"
    return doc


@case("good", "report")
def _(c: Ctx) -> Verdict:
    r = report(c, results_dir(c, "a"))
    missing = [f for f in ("report.html", "report.md") if not c.p(f"rep/{f}").exists()]
    return expect(r, 0) or (f"no {missing}" if missing else None)


@case("truncated, empty, zero bytes, NULs", "exit 2 with file+line", n=4)
def _(c: Ctx) -> list[Verdict]:
    text = (RESULTS / "results.json").read_text()
    raws = [text[: len(text) // 2], "\n  \n", "", "\0" * 64]
    out: list[Verdict] = []
    for i, raw in enumerate(raws):
        d = results_dir(c, f"r{i}", raw=raw)
        out.append(expect(report(c, d), names=[d / "results.json"]))
    return out


@case("Latin-1 byte in results.json (report, compare, resume)", "exit 2", n=3)
def _(c: Ctx) -> list[Verdict]:
    raw = (RESULTS / "results.json").read_bytes().replace(b'"engine"', b'"eng\xe9ine"', 1)
    d = results_dir(c, "bad", raw=raw)
    f = d / "results.json"
    return [
        expect(report(c, d), names=[f]),
        expect(c.sb("compare", d, RESULTS), names=[f]),
        expect(resume(c, d), names=[f]),
    ]


@case("`[]`; schema v999; no schema; another tool's JSON (2 shapes)", "exit 2", n=5)
def _(c: Ctx) -> list[Verdict]:
    v999 = {**results_doc(), "schema": "servebook.bench/999"}
    none = {k: v for k, v in results_doc().items() if k != "schema"}
    vllm_bench = {"date": "20261204-101010", "backend": "vllm", "completed": 10, "duration": 3.1}
    genai = {"results": [{"concurrency": 1, "throughput": 12.5}], "tool": "genai-perf"}
    docs = [[], v999, none, vllm_bench, genai]
    out: list[Verdict] = []
    for i, doc in enumerate(docs):
        d = results_dir(c, f"r{i}", doc)
        out.append(expect(report(c, d), names=[d / "results.json"]))
    return out


@case("no points", "report or refuse")
def _(c: Ctx) -> Verdict:
    return expect(report(c, results_dir(c, "a", {**results_doc(), "points": []})), (0, 2))


@case('wrong type in a point; `provenance: null`; `aggregates: "x"`', "exit 2 naming field", n=3)
def _(c: Ctx) -> list[Verdict]:
    wrong = results_doc()
    wrong["points"][0]["output_tokens_per_s"] = "fast"
    docs = [
        (wrong, "points.0.output_tokens_per_s"),
        ({**results_doc(), "provenance": None}, "provenance"),
        ({**results_doc(), "aggregates": "x"}, "aggregates"),
    ]
    return [
        expect(report(c, results_dir(c, f"r{i}", d)), names=[f]) for i, (d, f) in enumerate(docs)
    ]


@case("NaN, +inf, negative tok/s", "refuse or flag, no crash", n=3)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for i, v in enumerate([float("nan"), float("inf"), -5.0]):
        doc = results_doc()
        doc["points"][0]["output_tokens_per_s"] = v
        out.append(expect(report(c, results_dir(c, f"r{i}", doc)), (0, 2)))
    return out


@case("extra top key; partial stats; bad date", "tolerate", n=3)
def _(c: Ctx) -> list[Verdict]:
    extra = {**results_doc(), "colour": "blue"}
    partial = results_doc()  # aggregates for some load levels only
    partial["aggregates"] = partial["aggregates"][:1]
    bad_date = results_doc()
    bad_date["provenance"]["started_at"] = "yesterday"
    return [
        expect(report(c, results_dir(c, f"r{i}", d)), 0)
        for i, d in enumerate([extra, partial, bad_date])
    ]


@case("no results.json; results.json a directory; FIFO; /dev/zero symlink", "exit 2, no hang", n=4)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    none = c.p("none")
    none.mkdir()
    out.append(expect(report(c, none), names=[none]))
    isdir = c.p("isdir/results.json")
    isdir.mkdir(parents=True)
    out.append(expect(report(c, isdir.parent), names=[isdir.parent]))
    for kind in ("fifo", "dev-zero"):
        f = hostile(c, kind, f"{kind}/results.json")
        out.append(expect(report(c, f.parent), names=[f.parent]))
    return out


@case("`<script>` in target URL", "escaped")
def _(c: Ctx) -> Verdict:
    doc = results_doc()
    doc["provenance"]["target"]["url"] = "http://127.0.0.1:18000/<script>alert(1)</script>"
    r = report(c, results_dir(c, "a", doc))
    html = c.p("rep/report.html")
    if expect(r, 0) or not html.exists():
        return expect(r, 0) or "no report.html"
    return "report.html holds <script>alert(1)" if "<script>alert(1)" in html.read_text() else None


@case("100k nested arrays (report, compare, resume)", "exit 2", n=3)
def _(c: Ctx) -> list[Verdict]:
    d = results_dir(c, "deep", raw=deep_json())
    f = d / "results.json"
    return [
        expect(report(c, d), names=[f]),
        expect(c.sb("compare", d, RESULTS), names=[f]),
        expect(resume(c, d), names=[f]),
    ]


@case("compare A A", "exit 2")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a")
    return expect(c.sb("compare", a, a), says=["twice"])


@case("compare A symlink-to-A", "exit 2")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a")
    c.p("link").symlink_to(a)
    return expect(c.sb("compare", a, c.p("link")), says=["twice"])


@case("compare A copy-of-A `--reproduce`", "refuse / flag")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a")
    shutil.copytree(a, c.p("a2"))
    return expect(c.sb("compare", a, c.p("a2"), "--reproduce"), (1, 2))


@case("compare, different workload / model", "refuse, name the field", n=2)
def _(c: Ctx) -> list[Verdict]:
    a = results_dir(c, "a")
    wl = redated(results_doc())
    wl["provenance"]["workload"]["input_len"] = 999
    model = redated(results_doc())
    model["provenance"]["model"]["name"] = "other-model"
    return [
        expect(c.sb("compare", a, results_dir(c, "b1", wl)), (1, 2), names=["input_len"]),
        expect(c.sb("compare", a, results_dir(c, "b2", model)), (1, 2), names=["model"]),
    ]


@case("compare vs empty run; empty vs empty (`--reproduce`)", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    a = results_dir(c, "a")
    e1 = results_dir(c, "e1", redated({**results_doc(), "points": []}))
    e2 = results_dir(c, "e2", redated({**results_doc(), "points": []}, "2027-02-02T00:00:00+00:00"))
    return [
        expect(c.sb("compare", a, e1, "--reproduce")),
        expect(c.sb("compare", e1, e2, "--reproduce")),
    ]


@case("compare vs NaN run `--reproduce`", "verdict")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a")
    doc = redated(results_doc())
    for p in doc["points"]:
        p["output_tokens_per_s"] = float("nan")
    return expect(c.sb("compare", a, results_dir(c, "b", doc), "--reproduce"), (0, 1))


@case("report of 3 runs with mismatched provenance", "say so")
def _(c: Ctx) -> Verdict:
    dirs = []
    for i, v in enumerate(["0.30.0", "0.31.0", "0.32.0"]):
        doc = redated(results_doc(), f"2027-01-0{i + 1}T00:00:00+00:00")
        doc["provenance"]["engine_version"] = v
        dirs.append(results_dir(c, f"r{i}", doc))
    r = report(c, *dirs)
    md = c.p("rep/report.md")
    text = md.read_text() if md.exists() else ""
    return expect(r, 0) or (None if "differs" in text.lower() else "report.md does not say so")


@case("`--resume` truncated / schema / other tool / dir / other provenance", "exit 2", n=5)
def _(c: Ctx) -> list[Verdict]:
    text = (RESULTS / "results.json").read_text()
    trunc = results_dir(c, "t", raw=text[:100])
    schema = results_dir(c, "s", {**results_doc(), "schema": "servebook.bench/999"})
    other = results_dir(c, "o", {"date": "x", "backend": "vllm", "completed": 1})
    isdir = c.p("d/results.json")
    isdir.mkdir(parents=True)
    prov = results_dir(c, "p")  # the fixture run: another model, workload, target
    return [expect(resume(c, d)) for d in (trunc, schema, other, isdir.parent, prov)]


@case("`--resume` FIFO results.json", "exit 2")
def _(c: Ctx) -> Verdict:
    f = hostile(c, "fifo", "o/results.json")
    return expect(resume(c, f.parent), names=[f], says=["FIFO"])


@case("`--resume` /dev/zero results.json", "exit 2")
def _(c: Ctx) -> Verdict:
    f = hostile(c, "dev-zero", "o/results.json")
    return expect(resume(c, f.parent), names=[f], says=[NOT_REGULAR])


@case(
    "bench without `--resume`, existing (even corrupt/FIFO) results.json", "exit 2 before load", n=2
)
def _(c: Ctx) -> list[Verdict]:
    corrupt = results_dir(c, "c", raw="{")
    fifo = hostile(c, "fifo", "f/results.json")
    return [
        refused_before_load(c, *bench_args(c, c.shared.url, d), names=[d])
        for d in (corrupt, fifo.parent)
    ]


@case("unreadable results.json (caps dropped)", "exit 2")
def _(c: Ctx) -> Verdict:
    d = results_dir(c, "a")
    (d / "results.json").chmod(0)
    return expect(c.sb("report", d, "-o", c.p("rep/r.html"), no_dac=True), names=[d])


table("1", "lint")


def lint(c: Ctx, *args: str | Path, **kw: Any) -> Run:
    return c.sb("lint", *args, **kw)


def lint_text(c: Ctx, text: str | bytes, name: str = "m.yaml", **kw: Any) -> tuple[Run, Path]:
    p = c.p(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return lint(c, p, **kw), p


def timely(r: Run, bound: float, v: Verdict) -> Verdict:
    return v if r.seconds < bound else f"took {r.seconds:.1f} s (bound {bound:.0f} s)"


@case("alias bomb 10^5 leaves (305 B)", "fast")
def _(c: Ctx) -> Verdict:
    r, _p = lint_text(c, bomb_manifest(4))
    return timely(r, 15, expect(r, (0, 1, 2)))


@case("alias bomb 10^7 leaves (409 B)", "bounded")
def _(c: Ctx) -> Verdict:
    r, p = lint_text(c, bomb_manifest(6))
    return timely(r, 15, expect(r, (1, 2), names=[p]))


@case("100k nested `[`", "SB100 exit 2")
def _(c: Ctx) -> Verdict:
    r, p = lint_text(c, deep_json(), "m.json")
    return expect(r, names=[p], says=["SB100"])


@case("3000 nested mappings", "SB100 exit 2")
def _(c: Ctx) -> Verdict:
    r, p = lint_text(c, deep_yaml())
    return expect(r, names=[p], says=["SB100"])


@case("50 MB, 46,522 documents", "completes", long=True)
def _(c: Ctx) -> Verdict:
    doc = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-%d, namespace: ns}\n"
        "data: {k: '" + "x" * 1000 + "'}\n---\n"
    )
    p = c.p("big.yaml")
    with p.open("w") as f:
        for i in range(46_522):
            f.write(doc % i)
    r = lint(c, p, timeout=c.bound)
    c.notes.append(f"lint exit {r.rc} after {r.seconds:.0f} s (bound {c.bound:.0f} s)")
    if r.timed_out and c.bound <= BOUND_S:
        return Skip(
            f"did not finish within this re-run's {BOUND_S:.0f} s bound on a loaded 2-core "
            f"machine (the probe's run took 83 s and held); --slow gives it {LONG_BOUND_S:.0f} s"
        )
    return expect(r, (0, 1))


@case("multi-doc with one bad doc", "never silent")
def _(c: Ctx) -> Verdict:
    good = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
    r, p = lint_text(c, good + "---\n" + "a: [unclosed\n" + "---\n" + good)
    return expect(r, names=[p], says=["SB100", "line"])


@case('non-mapping docs, `items: 7`, `metadata: "x"`', "no crash")
def _(c: Ctx) -> Verdict:
    text = "- a\n- b\n---\n42\n---\nkind: List\nitems: 7\n---\nkind: Pod\nmetadata: x\n"
    r, _p = lint_text(c, text)
    return expect(r, (0, 1))


HELM_UNPARSED = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.name }}\n"
    "{{- if .Values.x }}\ndata: {}\n{{- end }}\n"
)
HELM_PARSES = (
    'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: "{{ .Values.name }}"\n'
    'data:\n  k: "{{ .Values.k }}"\n'
)


@case("unrendered Helm template", "SB100 exit 2")
def _(c: Ctx) -> Verdict:
    r, p = lint_text(c, HELM_UNPARSED, "templates/cm.yaml")
    return expect(r, names=[p])


@case("Helm template that parses", "not a pass")
def _(c: Ctx) -> Verdict:
    r, p = lint_text(c, HELM_PARSES, "templates/cm.yaml")
    return expect(r, (1, 2), names=[p])


@case("`!!python/object/apply`", "no code run")
def _(c: Ctx) -> Verdict:
    marker = c.p("ran")
    r, p = lint_text(c, f"a: !!python/object/apply:os.system ['touch {marker}']\n")
    return expect(r, names=[p], says=["SB100"]) or ("code ran" if marker.exists() else None)


@case("binary, UTF-16", "SB100 exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    b = hostile(c, "binary", "b.yaml")
    u = c.p("u.yaml")
    u.write_bytes("apiVersion: v1\nkind: ConfigMap\n".encode("utf-16"))
    return [expect(lint(c, p), names=[p], says=["SB100"]) for p in (b, u)]


@case("BOM, CRLF", "parse", n=2)
def _(c: Ctx) -> list[Verdict]:
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: n}\ndata: {k: v}\n"
    r1, _ = lint_text(c, b"\xef\xbb\xbf" + text.encode(), "bom.yaml")
    r2, _ = lint_text(c, text.replace("\n", "\r\n").encode(), "crlf.yaml")
    return [expect(r1, 0), expect(r2, 0)]


@case("FIFO file", "no hang")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "fifo", "x.yaml")
    return expect(lint(c, p), names=[p], says=["FIFO"])


@case("dir containing a FIFO `*.yaml`", "no hang")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "fifo", "d/x.yaml")
    (p.parent / "good.yaml").write_text("a: 1\n")
    return expect(lint(c, p.parent), names=[p], says=["FIFO"])


@case("/dev/zero symlink", "exit 2")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "dev-zero", "z.yaml")
    return expect(lint(c, p), names=[p], says=[NOT_REGULAR])


@case("dir with one `loop -> .`", "completes")
def _(c: Ctx) -> Verdict:
    d = c.p("d")
    d.mkdir()
    (d / "a.yaml").write_text("a: 1\n")
    (d / "loop").symlink_to(".")
    return expect(lint(c, d), 0)


@case("dir with two loop links", "completes")
def _(c: Ctx) -> Verdict:
    d = c.p("d2")
    d.mkdir()
    (d / "a.yaml").write_text("a: 1\n")
    (d / "loop").symlink_to(".")
    (d / "up").symlink_to("../d2")
    return expect(lint(c, d), 0)


@case("unreadable file in a dir (caps dropped)", "SB100")
def _(c: Ctx) -> Verdict:
    d = c.p("d")
    d.mkdir()
    (d / "a.yaml").write_text("a: 1\n")
    (d / "b.yaml").write_text("b: 1\n")
    (d / "b.yaml").chmod(0)
    return expect(lint(c, d, no_dac=True), names=[d / "b.yaml"], says=["SB100"])


@case("nonexistent path; empty dir; empty file", "exit 2 / 2 / 0", n=3)
def _(c: Ctx) -> list[Verdict]:
    c.p("empty").mkdir()
    c.p("e.yaml").write_text("")
    return [
        expect(lint(c, c.p("nope.yaml")), 2, names=[c.p("nope.yaml")]),
        expect(lint(c, c.p("empty")), 2),
        expect(lint(c, c.p("e.yaml")), 0),
    ]


SEVEN = [
    "sk-ARGVKEY1111aaaa",
    "hf_ENVTOKEN2222bbbb",
    "URLPASS3333",
    "QUERYTOK4444",
    "sk-OPENAI5555cccc",
    "BEARER6666dddd",
    "DBPASS7777eeee",
]


@case("manifest with 7 literal secrets (argv, env, URL)", "redacted (table and --json)")
def _(c: Ctx) -> Verdict:
    a, hf, pw, tok, oa, be, db = SEVEN
    text = f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: x, namespace: n}}
spec:
  selector: {{matchLabels: {{app: x}}}}
  template:
    metadata: {{labels: {{app: x}}}}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.11.0
        args: ["--api-key", "{a}", "--url", "http://admin:{pw}@db:5432/?token={tok}"]
        command: ["sh", "-c", "curl -H 'Authorization: Bearer {be}' http://x"]
        env:
        - {{name: HF_TOKEN, value: {hf}}}
        - {{name: OPENAI_API_KEY, value: {oa}}}
        - {{name: DB_PASSWORD, value: {db}}}
"""
    r1, p = lint_text(c, text)
    r2 = lint(c, p, "--json")
    return first(expect(r1, (0, 1), secrets=SEVEN), expect(r2, (0, 1), secrets=SEVEN))


@case('doc with `curl -H "Authorization: Bearer X"`', "redacted")
def _(c: Ctx) -> Verdict:
    k = "LINTDOCBEARER1212"
    doc = f'```sh\ncurl -H "Authorization: Bearer {k}" http://x\n```\n'
    r1, p = lint_text(c, doc, "d.md")
    r2 = lint(c, p, "--json")
    return first(expect(r1, (0, 1), secrets=[k]), expect(r2, (0, 1), secrets=[k]))


table("1", "probe")


def model(c: Ctx, name: str = "m") -> Path:
    d = c.p(name)
    d.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(c.shared.tiny, d, symlinks=True)
    return d


def probe(c: Ctx, *args: str | Path, **kw: Any) -> Run:
    return c.sb("probe", *args, "--mountinfo", MOUNTINFO, **kw)


SHARD = "model-00003-of-00004.safetensors"
INDEX = "model.safetensors.index.json"


@case("good model; path with space; with newline", "pass", n=3)
def _(c: Ctx) -> list[Verdict]:
    return [expect(probe(c, model(c, n)), 0) for n in ("m", "a b/m", "a\nb/m")]


@case("FIFO shard / config / index / tokenizer", "fail, no hang (tokenizer: said as a FIFO)", n=4)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for i, f in enumerate([SHARD, "config.json", INDEX, "tokenizer.json"]):
        d = model(c, f"m{i}")
        (d / f).unlink()
        os.mkfifo(d / f)
        r = probe(c, d)
        says = [NOT_REGULAR] if f == "tokenizer.json" else []  # D29: not "empty or dangling"
        out.append(expect(r, 1, names=[f], says=says))
    return out


@case("FIFO extra `*.safetensors` not in index", "pass")
def _(c: Ctx) -> Verdict:
    d = model(c)
    os.mkfifo(d / "extra.safetensors")
    return expect(probe(c, d), 0)


def sparse(p: Path, keep: int) -> None:
    """``p`` keeps its size and first ``keep`` bytes; the rest is a hole."""
    size = p.stat().st_size
    head = p.read_bytes()[:keep]
    with p.open("r+b") as f:
        f.truncate(0)
        f.write(head)
        f.truncate(size)


@case("zero-byte shard; fully sparse shard; header length 2^63", "fail", n=3)
def _(c: Ctx) -> list[Verdict]:
    d0, d1, d2 = model(c, "m0"), model(c, "m1"), model(c, "m2")
    (d0 / SHARD).write_bytes(b"")
    sparse(d1 / SHARD, 0)
    data = bytearray((d2 / SHARD).read_bytes())
    data[:8] = (2**63).to_bytes(8, "little")
    (d2 / SHARD).write_bytes(bytes(data))
    return [expect(probe(c, d), 1, names=[SHARD]) for d in (d0, d1, d2)]


@case("header intact, data a hole", "fail or warn")
def _(c: Ctx) -> Verdict:
    d = model(c)
    sparse(d / SHARD, 4096)
    return expect(probe(c, d), 1, names=[SHARD])


@case("/dev/zero or /dev/urandom as config, /dev/zero shard", "fail", n=3)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for i, (f, dev) in enumerate(
        [("config.json", "/dev/zero"), ("config.json", "/dev/urandom"), (SHARD, "/dev/zero")]
    ):
        d = model(c, f"m{i}")
        (d / f).unlink()
        (d / f).symlink_to(dev)
        out.append(expect(probe(c, d), 1, names=[f]))
    return out


@case("symlink loop shard; dir with `self`/`parent` links", "fail / pass, no hang", n=2)
def _(c: Ctx) -> list[Verdict]:
    d0, d1 = model(c, "m0"), model(c, "m1")
    (d0 / SHARD).unlink()
    (d0 / SHARD).symlink_to(SHARD)
    (d1 / "self").symlink_to(".")
    (d1 / "parent").symlink_to("..")
    return [expect(probe(c, d0), 1, names=[SHARD]), expect(probe(c, d1), 0)]


@case("190 MB config.json", "fail fast")
def _(c: Ctx) -> Verdict:
    d = model(c)
    with (d / "config.json").open("r+b") as f:
        f.truncate(190 * 2**20)
    r = probe(c, d)
    return timely(r, 10, expect(r, 1, names=["config.json"]))


@case("binary config.json", "fail")
def _(c: Ctx) -> Verdict:
    d = model(c)
    (d / "config.json").write_bytes(bytes(range(256)) * 4)
    return expect(probe(c, d), 1, names=["config.json"])


@case("deep config.json / index / safetensors header", "fail finding", n=3)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for i, f in enumerate(["config.json", INDEX]):
        d = model(c, f"m{i}")
        (d / f).write_text(deep_json())
        out.append(expect(probe(c, d), 1, names=[f]))
    d = model(c, "m2")
    header = deep_json(50_000).encode()
    body = (d / SHARD).read_bytes()
    n = int.from_bytes(body[:8], "little")
    (d / SHARD).write_bytes(len(header).to_bytes(8, "little") + header + body[8 + n :])
    out.append(expect(probe(c, d), 1, names=[SHARD]))
    return out


@case("`--find` over all of the above", "list, no abort; right verdicts", n=2)
def _(c: Ctx) -> list[Verdict]:
    good = model(c, "root/good")
    bad = model(c, "root/zero-shard")
    (bad / SHARD).write_bytes(b"")
    deep = model(c, "root/deep")
    (deep / "config.json").write_text(deep_json())
    fifo = model(c, "root/fifo-config")
    (fifo / "config.json").unlink()
    os.mkfifo(fifo / "config.json")

    def verdicts(r: Run, want: dict[Path, bool]) -> Verdict:
        v = expect(r, (0, 1))
        if v:
            return v
        try:
            got = {Path(x["path"]): x["complete"] for x in json.loads(r.out)["candidates"]}
        except (ValueError, KeyError, TypeError) as e:
            return f"--json did not list candidates ({e}) | {r.text[:300]}"
        wrong = [f"{p.name}: {got.get(p)}" for p, ok in want.items() if got.get(p) is not ok]
        return f"wrong or missing verdicts: {wrong}" if wrong else None

    want = {good: True, bad: False, deep: False, fifo: False}
    with_deep = verdicts(probe(c, "--find", c.p("root"), "--json"), want)
    shutil.rmtree(deep)
    del want[deep]
    without = verdicts(probe(c, "--find", c.p("root"), "--json"), want)
    return [with_deep, without]


@case("unreadable files (caps dropped)", "fail")
def _(c: Ctx) -> Verdict:
    d = model(c)
    for f in ("config.json", SHARD, "tokenizer.json"):
        (d / f).chmod(0)
    return expect(probe(c, d, no_dac=True), 1, names=["config.json"])


@case("`/nonexistent`, a file, `/dev/null`", "exit 2 (D30: not a failing check)")
def _(c: Ctx) -> Verdict:
    f = c.p("file.txt")
    f.write_text("x\n")
    return first(*(expect(probe(c, p), 2, names=[p]) for p in ("/nonexistent", f, "/dev/null")))


@case("`--max-depth -1`, `--timeout 0/nan/-5`", "exit 2", n=4)
def _(c: Ctx) -> list[Verdict]:
    flags = [("--max-depth", "-1"), ("--timeout", "0"), ("--timeout", "nan"), ("--timeout", "-5")]
    return [expect(probe(c, "--find", c.root, f, v), names=[f]) for f, v in flags]


def probe_mountinfo(c: Ctx, mi: Path) -> Run:
    return c.sb("probe", model(c), "--mountinfo", mi)


@case("`--mountinfo` binary", "exit 2")
def _(c: Ctx) -> Verdict:
    mi = hostile(c, "binary", "mountinfo")
    return expect(probe_mountinfo(c, mi), names=[mi])


@case("`--mountinfo` /dev/zero", "exit 2")
def _(c: Ctx) -> Verdict:
    mi = hostile(c, "dev-zero", "mountinfo")
    return expect(probe_mountinfo(c, mi), names=[mi], says=[NOT_REGULAR])


@case("`--mountinfo` FIFO", "exit 2")
def _(c: Ctx) -> Verdict:
    mi = hostile(c, "fifo", "mountinfo")
    return expect(probe_mountinfo(c, mi), names=[mi], says=["FIFO"])


@case("long dir name piped at COLUMNS=60", "not cut")
def _(c: Ctx) -> Verdict:
    name = "model-" + "x" * 114
    d = model(c, name)
    r = probe(c, d, columns="60")
    return expect(r, 0, names=[name], not_says=["…"])


table("1", "preflight vllm-pd --snapshot (healthy.json passes, exit 0)")


def healthy() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(HEALTHY.read_text())
    return doc


def preflight(c: Ctx, snap: Path | str, *extra: str | Path, **kw: Any) -> Run:
    sets = [a for s in PD_SETS for a in ("--set", s)]
    return c.sb("preflight", "vllm-pd", "--snapshot", snap, *sets, *extra, **kw)


def snapshot(c: Ctx, doc: Any = None, raw: str | bytes | None = None, name: str = "s.json") -> Path:
    p = c.p(name)
    if raw is not None:
        p.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    else:
        p.write_text(json.dumps(doc))
    return p


def gpu_node(doc: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = next(
        i for i in doc["items"] if i["kind"] == "Node" and i["metadata"]["name"] == "gpu-a"
    )
    return node


def a_pod(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = next(i for i in doc["items"] if i["kind"] == "Pod")
    return pod


@case(
    "truncated, empty, not JSON, array, string, `items: null`, no items, junk items",
    "exit 2",
    n=8,
)
def _(c: Ctx) -> list[Verdict]:
    text = HEALTHY.read_text()
    raws: list[str] = [text[: len(text) // 2], "", "not json at all", "[]", '"a string"']
    raws += [json.dumps({**healthy(), "items": None})]
    raws += [json.dumps({k: v for k, v in healthy().items() if k != "items"})]
    raws += [json.dumps({**healthy(), "items": [1, "x", None]})]
    out: list[Verdict] = []
    for i, raw in enumerate(raws):
        p = snapshot(c, raw=raw, name=f"s{i}.json")
        out.append(expect(preflight(c, p), names=[p]))
    return out


@case("GPU quantity `eight`", "error (exit 2)")
def _(c: Ctx) -> Verdict:
    doc = healthy()
    gpu_node(doc)["status"]["allocatable"]["nvidia.com/gpu"] = "eight"
    return expect(preflight(c, snapshot(c, doc)), 2, names=["gpu-a"])


@case("`-8`, `allocatable: null`, Ready without status", "fail (exit 1)", n=3)
def _(c: Ctx) -> list[Verdict]:
    a, b, r = healthy(), healthy(), healthy()
    gpu_node(a)["status"]["allocatable"]["nvidia.com/gpu"] = "-8"
    gpu_node(b)["status"]["allocatable"] = None
    for cond in gpu_node(r)["status"]["conditions"]:
        if cond["type"] == "Ready":
            del cond["status"]
    return [
        expect(preflight(c, snapshot(c, d, name=f"s{i}.json")), 1) for i, d in enumerate([a, b, r])
    ]


@case("`1e400`, int quantity, NaN cpu, null resources/containers, duplicate node", "no crash", n=6)
def _(c: Ctx) -> list[Verdict]:
    docs = [healthy() for _ in range(6)]
    raws = []
    gpu_node(docs[0])["status"]["allocatable"]["memory"] = "@1E400@"
    gpu_node(docs[1])["status"]["allocatable"]["nvidia.com/gpu"] = 8
    gpu_node(docs[2])["status"]["allocatable"]["cpu"] = "NaN"
    for ct in a_pod(docs[3])["spec"]["containers"]:
        ct["resources"] = None
    a_pod(docs[4])["spec"]["containers"] = None
    docs[5]["items"].append(gpu_node(docs[5]))
    for d in docs:
        raws.append(json.dumps(d).replace('"@1E400@"', "1e400"))
    return [
        expect(preflight(c, snapshot(c, raw=r, name=f"s{i}.json")), (0, 1))
        for i, r in enumerate(raws)
    ]


@case("`metadata: null`, name int", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    a, b = healthy(), healthy()
    gpu_node(a)["metadata"] = None
    gpu_node(b)["metadata"]["name"] = 7
    return [
        expect(preflight(c, p := snapshot(c, d, name=f"s{i}.json")), names=[p])
        for i, d in enumerate([a, b])
    ]


@case('Node `status: "Ready"`', "exit 2")
def _(c: Ctx) -> Verdict:
    doc = healthy()
    gpu_node(doc)["status"] = "Ready"
    return expect(preflight(c, p := snapshot(c, doc)), names=[p, "gpu-a"])


@case('`taints: "NoSchedule"`', "exit 2")
def _(c: Ctx) -> Verdict:
    doc = healthy()
    gpu_node(doc)["spec"]["taints"] = "NoSchedule"
    return expect(preflight(c, p := snapshot(c, doc)), names=[p, "gpu-a"])


@case("100k nesting", "exit 2")
def _(c: Ctx) -> Verdict:
    p = snapshot(c, raw=deep_json())
    return expect(preflight(c, p), names=[p])


@case("binary, Latin-1", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    b = snapshot(c, raw=bytes(range(256)) * 4, name="b.json")
    lat = snapshot(c, raw=HEALTHY.read_bytes().replace(b'"cp-1"', b'"cp-\xe9"', 1), name="l.json")
    return [expect(preflight(c, p), names=[p]) for p in (b, lat)]


@case("FIFO", "exit 2")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "fifo", "s.json")
    return expect(preflight(c, p), names=[p], says=["FIFO"])


@case("/dev/zero", "exit 2")
def _(c: Ctx) -> Verdict:
    p = hostile(c, "dev-zero", "s.json")
    return expect(preflight(c, p), names=[p], says=[NOT_REGULAR])


@case("`--snapshot /nonexistent`; `--weights abc`, `-5Gi`, FIFO", "exit 2", n=4)
def _(c: Ctx) -> list[Verdict]:
    fifo = hostile(c, "fifo", "w.json")
    return [
        expect(preflight(c, "/nonexistent"), names=["/nonexistent"]),
        expect(preflight(c, HEALTHY, "--weights", "abc"), names=["abc"]),
        expect(preflight(c, HEALTHY, "--weights", "-5Gi"), names=["-5Gi"]),
        expect(preflight(c, HEALTHY, "--weights", fifo), names=[fifo]),
    ]


table("1", "bench flags (all refused before any load)")


def flag_refused(c: Ctx, flag: str, value: str, names: Sequence[str] = ()) -> Verdict:
    args = bench_args(c, c.shared.url, c.p("out"))
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    v = refused_before_load(c, *args, names=names or [flag])
    return v or nothing_written(c)


@case("concurrency `0`,`-1`,`1,,2`,`a`,`1,1`", "exit 2", n=5)
def _(c: Ctx) -> list[Verdict]:
    return [flag_refused(c, "--concurrency", v) for v in ("0", "-1", "1,,2", "a", "1,1")]


@case("duration `0s`,`-1s`,`nan`,`1y`,`1e9s`; warmup `-1s`", "exit 2", n=6)
def _(c: Ctx) -> list[Verdict]:
    out = [flag_refused(c, "--duration", v) for v in ("0s", "-1s", "nan", "1y", "1e9s")]
    return [*out, flag_refused(c, "--warmup", "-1s")]


@case("precision `150%`, `nan`; `--max-repetitions 1`", "exit 2", n=3)
def _(c: Ctx) -> list[Verdict]:
    out = [flag_refused(c, "--precision", v) for v in ("150%", "nan")]
    return [*out, flag_refused(c, "--max-repetitions", "1")]


@case("input/output len 0 / negative / over max_model_len", "exit 2", n=5)
def _(c: Ctx) -> list[Verdict]:
    cases = [("--input-len", "0"), ("--input-len", "-5"), ("--output-len", "0")]
    cases += [("--output-len", "-5"), ("--input-len", "4096")]
    return [flag_refused(c, f, v) for f, v in cases]


@case("slo `ttft=abc`, `foo=1ms`", "exit 2", n=2)
def _(c: Ctx) -> list[Verdict]:
    return [flag_refused(c, "--slo", v, names=[v]) for v in ("ttft=abc", "foo=1ms")]


@case("rate `0`,`-1`,`nan`; api `foo`; order `random`; repetitions `0`,`-3`", "exit 2", n=7)
def _(c: Ctx) -> list[Verdict]:
    cases = [("--rate", "0"), ("--rate", "-1"), ("--rate", "nan"), ("--api", "foo")]
    cases += [("--order", "random"), ("--repetitions", "0"), ("--repetitions", "-3")]
    return [flag_refused(c, f, v) for f, v in cases]


@case("min-achieved-concurrency `0`,`nan`; agents `0`", "exit 2", n=3)
def _(c: Ctx) -> list[Verdict]:
    cases = [("--min-achieved-concurrency", "0"), ("--min-achieved-concurrency", "nan")]
    cases += [("--agents", "0")]
    return [flag_refused(c, f, v) for f, v in cases]


@case("`--seed -1`", "exit 2")
def _(c: Ctx) -> Verdict:
    return flag_refused(c, "--seed", "-1")


@case("`--request-timeout -1`", "exit 2")
def _(c: Ctx) -> Verdict:
    return flag_refused(c, "--request-timeout", "-1")


@case("`--request-timeout nan`", "exit 2, no claim of saved points")
def _(c: Ctx) -> Verdict:
    v = flag_refused(c, "--request-timeout", "nan")
    return v


@case("`--request-timeout 0`", 'exit 2 "must be > 0"')
def _(c: Ctx) -> Verdict:
    return flag_refused(c, "--request-timeout", "0")


@case(
    "`--warmup 0r`, `--precision 0%`, `--agents 1000`, `--max-client-lag-ms nan`",
    "accept or refuse",
    n=4,
)
def _(c: Ctx) -> list[Verdict]:
    def ran(i: int, f: str, v: str) -> Verdict:
        args = bench_args(c, c.shared.url, c.p(f"out{i}"))
        if f in args:
            args[args.index(f) + 1] = v
        else:
            args += [f, v]
        return expect(c.sb(*args, timeout=30), (0, 1, 2))

    out = [ran(0, "--warmup", "0r"), ran(1, "--precision", "0%"), agents_1000(c)]
    out.append(ran(3, "--max-client-lag-ms", "nan"))
    return out


def agents_1000(c: Ctx) -> Verdict:
    """The probe's own case: --agents 1000 on its short sweep (c=1,2), which it accepted
    and ran.  A level's agents are at most its concurrency (``bench/protocol.py``), so it
    starts 1 and then 2 agents, not 1000 processes: held when it ends within the bound and
    no more than 2 agent processes (``servebook.bench.agent``) ever ran."""
    out = c.p("out2")
    t0 = time.monotonic()
    proc = start(c, *bench_args(c, c.shared.url, out, "--agents", "1000"))
    most = 0  # load agents alive at one time
    deadline = t0 + BOUND_S
    while proc.poll() is None and time.monotonic() < deadline:
        now = 0
        for pid in session_pids(proc.pid):
            with contextlib.suppress(OSError):
                now += b"servebook.bench.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
        most = max(most, now)
        time.sleep(0.1)
    r = finish(proc, deadline - time.monotonic(), t0)
    c.notes.append(f"--agents 1000: exit {r.rc} after {r.seconds:.0f} s, at most {most} agents")
    many = (
        f"{most} load agents ran at once: --agents 1000 was not capped at the largest "
        "level's concurrency (2)"
    )
    return first(
        expect(r, (0, 1, 2)),
        many if most > 2 else None,
        None if most or r.rc == 2 else "no load agent was seen",
    )


# =========================================================================================
# Section 3: secrets
# =========================================================================================

table("3", "secrets")

KEY = "sk-RERUNKEY4242abcd"


@contextlib.contextmanager
def keyed_engine(c: Ctx, key: str = KEY, **kw: Any) -> Iterator[tuple[str, Any]]:
    from tests.unit.engine_standin import scripted_engine

    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json", require_key=key, **kw) as e:
        yield e


def nowhere(c: Ctx, secret: str, *runs: Run) -> Verdict:
    """``secret`` in no output and no file under the case's directory (results, reports,
    saved requests, SERVEBOOK_HOME)."""
    for r in runs:
        if secret in r.out + r.err:
            return f"printed by `{' '.join(map(str, r.args[:2]))}` | {r.text[:300]}"
    found = leaks(c.root, secret)
    return f"{secret} written to {found}" if found else None


def bench_report_compare(
    c: Ctx, url: str, *extra: str, env: dict[str, str] | None = None
) -> Verdict:
    b = c.sb(*bench_args(c, url, c.p("out"), *extra), env=env, timeout=30)
    rep = c.sb("report", c.p("out"), "-o", c.p("rep/report.html"))
    cmp = c.sb("compare", c.p("out"), RESULTS, "--force", "-o", c.p("cmp"))
    return first(expect(b, 0), expect(rep, 0), expect(cmp, (0, 1)), nowhere(c, KEY, b, rep, cmp))


@case("`--api-key K` (bench, report, compare)", "K nowhere")
def _(c: Ctx) -> Verdict:
    with keyed_engine(c) as (url, _):
        return bench_report_compare(c, url, "--api-key", KEY)


@case("`--api-key=K`", "K nowhere")
def _(c: Ctx) -> Verdict:
    with keyed_engine(c) as (url, _):
        return bench_report_compare(c, url, f"--api-key={KEY}")


@case("`OPENAI_API_KEY`", "K nowhere")
def _(c: Ctx) -> Verdict:
    with keyed_engine(c) as (url, _):
        return bench_report_compare(c, url, env={"OPENAI_API_KEY": KEY})


@case("`VLLM_API_KEY`", "K nowhere")
def _(c: Ctx) -> Verdict:
    with keyed_engine(c) as (url, _):
        return bench_report_compare(c, url, env={"VLLM_API_KEY": KEY})


@case("wrong key / no key (401)", "exit 2, K hidden", n=2)
def _(c: Ctx) -> list[Verdict]:
    wrong = "sk-WRONGKEY9090abcd"
    with keyed_engine(c) as (url, _):
        r1 = c.sb(*bench_args(c, url, c.p("o1"), "--api-key", wrong))
        r2 = c.sb(*bench_args(c, url, c.p("o2")))
    return [
        first(expect(r1, 2, says=["401"]), nowhere(c, wrong, r1)),
        first(expect(r2, 2, says=["401"]), nowhere(c, KEY, r2)),
    ]


def session_pids(sid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(d.name)) == sid:
                    pids.append(int(d.name))
    return pids


@case("`--agents 2` argv/environ of agents", "K absent")
def _(c: Ctx) -> Verdict:
    with keyed_engine(c) as (url, _):
        code = "\n".join([*MEMORY_BOUND, "from servebook.entry import main", "main()"])
        # The key by flag, as the probe gave it (a variable of bench's own environment is
        # every child's by inheritance).
        flags = ("--agents", "2", "--api-key", KEY)
        args = [str(a) for a in bench_args(c, url, c.p("out"), *flags)]
        env = {**os.environ, "SERVEBOOK_HOME": str(c.home)}
        for name in ("OPENAI_API_KEY", "VLLM_API_KEY"):
            env.pop(name, None)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=env,
            cwd=c.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        seen, holding = 0, []
        own = b""
        with contextlib.suppress(OSError):
            own = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        try:
            deadline = time.monotonic() + 25
            while proc.poll() is None and time.monotonic() < deadline:
                for pid in session_pids(proc.pid):
                    if pid == proc.pid:  # the user's own bench: its argv has the key
                        continue
                    seen += 1
                    for part in ("cmdline", "environ"):
                        with contextlib.suppress(OSError):
                            data = Path(f"/proc/{pid}/{part}").read_bytes()
                            # A fork of bench not yet exec'd shows bench's own argv: the
                            # user's, which the probe set aside too.
                            if part == "cmdline" and data == own:
                                continue
                            if KEY.encode() in data:
                                holding.append(f"{pid}/{part}")
                time.sleep(0.3)
            timed_out = proc.poll() is None
        finally:
            kill_group(proc)
    if holding:
        return f"agent processes hold the key: {sorted(set(holding))}"
    if timed_out:
        return "bench --agents 2 did not end within 25 s"
    return None if seen else "no agent process was seen"


@case(
    "server echoes K in 500 body (flag; env + agents + save-requests)",
    "redacted everywhere",
    n=2,
)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for i, (extra, env) in enumerate(
        [
            (["--api-key", KEY], None),
            (["--agents", "2", "--save-requests"], {"OPENAI_API_KEY": KEY}),
        ]
    ):
        with keyed_engine(c, fault="echo500", fault_after=6) as (url, _):
            b = c.sb(*bench_args(c, url, c.p(f"out{i}"), *extra), env=env, timeout=30)
        rep = c.sb("report", c.p(f"out{i}"), "-o", c.p(f"rep{i}/report.html"))
        echoed = (
            c.p(f"out{i}/results.json").exists()
            and "invalid request" in c.p(f"out{i}/results.json").read_text()
        )
        v = first(expect(b, 1), expect(rep, 0), nowhere(c, KEY, b, rep))
        out.append(v or (None if echoed else "no echoed error reached results.json"))
    return out


def seckey_recipe(c: Ctx, key: str, hf: str | None = None) -> Path:
    text = TINY_MIXED.read_text()
    # the tiny recipes' engine_args end in their extra_engine_args element
    text = text.replace("--enforce-eager,", f"--enforce-eager, --api-key, {key},")
    text = text.replace("name: tiny-mixed", "name: seckey", 1)
    if hf:
        text = text.replace("    env:\n", f"    env:\n      HF_TOKEN: {hf}\n", 1)
    p = c.p("seckey.yaml")
    p.write_text(text)
    return p


RKEY = "RECIPEKEY4321abcd"


@case(
    "recipe engine_args `--api-key K` (stand-in engine): results, report, `status --json`",
    "redacted",
    n=3,
)
def _(c: Ctx) -> list[Verdict]:
    recipe = seckey_recipe(c, RKEY)
    env = {**standin_env(c), "OPENAI_API_KEY": RKEY}
    u = c.sb("up", recipe, "--name", "sec2", "--timeout", "25", env=env, timeout=30)
    try:
        if u.rc != 0:
            v = expect(u, 0)
            return [v, v, v]
        b = c.sb("bench", "sec2", *bench_args(c, "", c.p("out"))[3:], env=env, timeout=30)
        rep = c.sb("report", c.p("out"), "-o", c.p("rep/report.html"), env=env)
        st = c.sb("status", "sec2", "--json", env=env)
        res_v = first(
            expect(b, (0, 1), secrets=[RKEY]),
            expect(u, 0, secrets=[RKEY]),
            nowhere_in(c.p("out"), RKEY),
        )
        rep_v = first(expect(rep, 0, secrets=[RKEY]), nowhere_in(c.p("rep"), RKEY))
        st_v = expect(st, 0, secrets=[RKEY])
    finally:
        c.sb("down", "sec2", env=env, timeout=30)
    return [res_v, rep_v, st_v]


@case(
    "same: vLLM's own log (a real engine)",
    "K nowhere in the log nor under SERVEBOOK_HOME",
    needs="engines",
    why_not="what vLLM's own log keeps of a key needs a real vLLM engine: " + ENGINES_WHY,
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "seclog")
    recipe = seckey_recipe(c, RKEY)
    env = {"OPENAI_API_KEY": RKEY}  # what up's readiness request sends
    u = Tracked(c, *up_args(c, "seclog", recipe), env=env).finish(ENGINE_BOUND_S)
    logs = sorted((c.home / "deployments" / "seclog" / "logs").glob("*.log"))
    said = "".join(f.read_text(errors="replace") for f in logs)
    d = c.sb("down", "seclog", timeout=120)
    return first(
        expect(u, 0, secrets=[RKEY]),
        None if len(said.splitlines()) > 1 else f"no engine log to search in {logs}",
        nowhere_in(c.home, RKEY),
        expect(d, 0, secrets=[RKEY]),
        nothing_left(c, "seclog"),
    )


def nowhere_in(where: Path, secret: str) -> Verdict:
    found = leaks(where, secret)
    return f"{secret} written to {found}" if found else None


@case("same: `state.json`", "redacted, mode 0600")
def _(c: Ctx) -> Verdict:
    recipe = seckey_recipe(c, RKEY)
    env = {**standin_env(c), "OPENAI_API_KEY": RKEY}
    u = c.sb("up", recipe, "--name", "sec2", "--timeout", "25", env=env, timeout=30)
    try:
        state = c.home / "deployments" / "sec2" / "state.json"
        if not state.exists():
            return expect(u, 0) or "no state.json"
        mode = state.stat().st_mode & 0o777
        n = state.read_text().count(RKEY)
        return first(
            expect(u, 0),
            f"state.json holds the key {n} time(s)" if n else None,
            f"state.json is mode {mode:o}" if mode & 0o077 else None,
        )
    finally:
        c.sb("down", "sec2", env=env, timeout=30)


@case("same: `recipes show` text / `--json`", "redacted", n=2)
def _(c: Ctx) -> list[Verdict]:
    recipe = seckey_recipe(c, RKEY)
    return [
        expect(c.sb("recipes", "show", recipe), 0, secrets=[RKEY], says=["--api-key"]),
        expect(c.sb("recipes", "show", recipe, "--json"), 0, secrets=[RKEY]),
    ]


@case("recipe env `HF_TOKEN` in `recipes show`", "redacted")
def _(c: Ctx) -> Verdict:
    hf = "hf_RECIPETOKEN8765abcd"
    recipe = seckey_recipe(c, RKEY, hf=hf)
    r = c.sb("recipes", "show", recipe)
    return expect(r, 0, secrets=[hf], says=["HF_TOKEN"])


not_rerun(
    '`render --set extra_engine_args="--api-key K"`, `--set hf_token=K`, URL `user:pw@`, '
    "URL password with `@`, URL `?api_key=`/`?token=`, lint secrets",
    "counted in section 1",
    "counted once, in section 1, as the probe counts them",
    n=0,
)

ATT_TOKEN = "ATTACHTOK5432"
ATT_PW = "ATTACHPW9876"


@case("`attach` with URL creds / token: `attached.json`", "not stored in clear", n=2)
def _(c: Ctx) -> list[Verdict]:
    from tests.unit.engine_standin import engine

    out: list[Verdict] = []
    with engine() as url:
        for name, u, secret in [
            ("att1", url.replace("http://", f"http://admin:{ATT_PW}@"), ATT_PW),
            ("att2", f"{url}/?token={ATT_TOKEN}", ATT_TOKEN),
        ]:
            r = c.sb("attach", name, "--role", f"mixed={u}", "--entry", u, "--model", "tiny")
            rec = c.home / "deployments" / name / "attached.json"
            stored = rec.exists() and secret in rec.read_text()
            v = expect(r, (0, 2), secrets=[secret])
            out.append(first(v, f"{rec} holds it in clear" if stored else None))
    return out


EKEY = "sk-ENGINEKEY6543abcd"


@case(
    "same: `verify` table (2) / `verify --json` / `status --json` / bench results",
    "hidden",
    n=5,
)
def _(c: Ctx) -> list[Verdict]:
    """attach now refuses URL credentials (D5), so the table's two cases are the refused
    token URL's name and an engine whose own argv holds ``--api-key K`` (what attach reads
    from /proc); the other three are that engine's."""
    from tests.unit.engine_standin import engine

    with engine(flags=["--api-key", EKEY]) as url:
        a0 = c.sb(
            "attach", "tok", "--role", f"mixed={url}/?token={ATT_TOKEN}",
            "--entry", f"{url}/?token={ATT_TOKEN}", "--model", "tiny",
        )  # fmt: skip
        v0 = c.sb("verify", "tok")
        a = c.sb("attach", "eng", "--role", f"mixed={url}", "--entry", url, "--model", "tiny")
        if a.rc != 0:
            v = expect(a, 0)
            return [expect(v0, (0, 1, 2), secrets=[ATT_TOKEN]), v, v, v, v]
        v1 = c.sb("verify", "eng")
        v2 = c.sb("verify", "eng", "--json")
        st = c.sb("status", "eng", "--json")
        b = c.sb("bench", "eng", *bench_args(c, "", c.p("out"))[3:], timeout=25)
    return [
        first(expect(a0, (0, 2), secrets=[ATT_TOKEN]), expect(v0, (0, 1, 2), secrets=[ATT_TOKEN])),
        expect(v1, (0, 1), secrets=[EKEY]),
        expect(v2, (0, 1), secrets=[EKEY]),
        expect(st, (0, 1), secrets=[EKEY]),
        first(expect(b, (0, 1, 2), secrets=[EKEY]), nowhere_in(c.p("out"), EKEY)),
    ]


@case(
    "redactor probes (Token scheme, `api-key=`, `DB_PASS`, plural, dash value, spaced value)",
    "redacted",
)
def _(c: Ctx) -> Verdict:
    probes = {
        "Authorization: Token TOKSCHEME1111": "TOKSCHEME1111",
        "api-key=sk-KEBAB2222abcd": "KEBAB2222",
        "DB_PASS=DBPASS3333x": "DBPASS3333",
        "OPENAI_API_KEYS=sk-PLURAL4444abcd": "PLURAL4444",
        "--api-key -DASHVAL5555": "DASHVAL5555",
        '--api-key "sk with SPACED6666"': "SPACED6666",
        "http://admin:hunter2@TAILSECRET7777@host": "TAILSECRET7777",
    }
    code = (
        "import json, sys\nfrom servebook import redact\n"
        "print(json.dumps([redact.text(s) for s in json.loads(sys.argv[1])]))"
    )
    r = spawn(
        [sys.executable, "-c", code, json.dumps(list(probes))],
        {**os.environ, "PYTHONPATH": this_checkout(os.environ.get("PYTHONPATH"))},
        20,
        cwd=c.root,
    )
    if r.rc != 0:
        return expect(r, 0)
    got = json.loads(r.out)
    left = [g for g, secret in zip(got, probes.values(), strict=True) if secret in g]
    return f"not redacted: {left}" if left else None


# =========================================================================================
# Piped output
# =========================================================================================

table("piped", "piped output")


@case(
    "`probe --find` / `probe DIR` with a 120-character name, piped, COLUMNS=60/unset",
    "name whole",
    n=3,
)
def _(c: Ctx) -> list[Verdict]:
    name = "model-" + "y" * 114
    d = model(c, f"root/{name}")
    return [
        expect(probe(c, "--find", c.p("root"), columns="60"), 0, names=[name], not_says=["…"]),
        expect(probe(c, d, columns="60"), 0, names=[name], not_says=["…"]),
        expect(probe(c, d, columns=None), 0, names=[name], not_says=["…"]),
    ]


@case("`compare` of two 100-character run names, piped, COLUMNS=80", "whole")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a" * 100)
    b = results_dir(c, "b" * 100, redated(results_doc()))
    r = c.sb("compare", a, b, columns="80")
    return expect(r, (0, 1), names=["a" * 100, "b" * 100], not_says=["…"])


@case("`status`, `recipes`, `report` piped", "no `…`", n=3)
def _(c: Ctx) -> list[Verdict]:
    env = standin_env(c)
    name = "a-rather-long-deployment-name"
    up_ = c.sb("up", "tiny-mixed", "--name", name, env=env)
    st = c.sb("status", columns="60", env=env)
    c.sb("down", name, env=env)
    return [
        first(expect(up_, 0), expect(st, 0, names=[name], not_says=["…"])),
        expect(c.sb("recipes", columns="60"), 0, not_says=["…"]),
        expect(
            c.sb("report", results_dir(c, "r"), "-o", c.p("rep/r.html"), columns="60"),
            0,
            not_says=["…"],
        ),
    ]


# =========================================================================================
# Section 2: faults during runs (the scripted engine plays the probe's fault server)
# =========================================================================================

table("2", "faults during runs")


def start(
    c: Ctx, *args: str | Path, env: dict[str, str] | None = None, no_dac: bool = False
) -> subprocess.Popen[str]:
    """``servebook ARGS`` started in a session of its own, to be signalled or faulted
    while it runs; ``finish`` collects it."""
    code = "\n".join([*MEMORY_BOUND, "from servebook.entry import main", "main()"])
    argv = [*(NO_DAC if no_dac else []), sys.executable, "-c", code, *map(str, args)]
    full = {**os.environ, "SERVEBOOK_HOME": str(c.home), "COLUMNS": "200", **(env or {})}
    full["PYTHONPATH"] = this_checkout(full.get("PYTHONPATH"))
    for name in ("OPENAI_API_KEY", "VLLM_API_KEY"):
        if name not in (env or {}):
            full.pop(name, None)
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
        cwd=c.root,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float, t0: float) -> Run:
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, err = proc.communicate()
    args = [str(a) for a in proc.args[3:]] if isinstance(proc.args, list) else []
    return Run(args, proc.returncode, out, err, time.monotonic() - t0, timed_out, timeout)


def wait_for(pred: Callable[[], bool], bound: float) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def points(d: Path) -> list[dict[str, Any]]:
    f = d / "results.json"
    if not f.exists():
        return []
    with contextlib.suppress(ValueError):
        pts: list[dict[str, Any]] = json.loads(f.read_text()).get("points", [])
        return pts
    return []


def results_intact(d: Path) -> Verdict:
    f = d / "results.json"
    if not f.exists():
        return "no results.json"
    try:
        json.loads(f.read_text())
    except ValueError as e:
        return f"results.json is not whole: {e}"
    temps = [x.name for x in d.iterdir() if x.name.startswith(".") or x.suffix == ".tmp"]
    return f"temporary files left: {temps}" if temps else None


def invalid_with_evidence(c: Ctx, r: Run, out: Path) -> Verdict:
    pts = points(out)
    return first(
        expect(r, 1),
        None if pts else "no points in results.json",
        "a point is valid" if any(p.get("valid") for p in pts) else None,
        None if all(p.get("invalid_reasons") for p in pts) else "a point gives no reason",
    )


def fault_bench(c: Ctx, *extra: str, **engine: Any) -> Verdict:
    from tests.unit.engine_standin import scripted_engine

    out = c.p("out")
    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json", **engine) as (url, _):
        r = c.sb(*bench_args(c, url, out, *extra), timeout=30)
    return invalid_with_evidence(c, r, out)


@case("all 500", "invalid, exit 1, evidence")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="500")


@case("every other 500", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="500half")


@case("SSE data not JSON", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="malformed")


@case("JSON of wrong shape", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="badjson")


@case("other model in every chunk", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, answer_model="someone-else")


@case("connection closed after 1 token", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="close")


@case("200 with only `[DONE]`", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="notokens")


@case("usage lies 10x", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="usage_lie")


@case("3x the tokens", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="moretokens")


@case("non-SSE 200 JSON", "invalid")
def _(c: Ctx) -> Verdict:
    return fault_bench(c, fault="plain200")


STALL = ("--concurrency", "1", "--request-timeout", "2", "--stall", "6s")


def one_level(args: list[str | Path]) -> list[str | Path]:
    """``args`` with the concurrency flag left out (the caller gives its own)."""
    i = args.index("--concurrency")
    return args[:i] + args[i + 2 :]


@case("server never answers (`--request-timeout 2`, `--stall 6s`)", "fail with evidence")
def _(c: Ctx) -> Verdict:
    from tests.unit.engine_standin import scripted_engine

    out = c.p("out")
    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json", answer=0) as (url, _):
        r = c.sb(*one_level(bench_args(c, url, out)), *STALL, timeout=30)
    return first(expect(r, 1), None if (out / "results.json").exists() else "no results.json")


@case("one byte every 0.5 s", "fail")
def _(c: Ctx) -> Verdict:
    from tests.unit.engine_standin import scripted_engine

    out = c.p("out")
    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json", fault="slowdrip") as (u, _):
        r = c.sb(*one_level(bench_args(c, u, out)), *STALL, timeout=30)
    return expect(r, 1)


def fault_mid_sweep(
    c: Ctx, act: Callable[[subprocess.Popen[bytes]], None], *extra: str
) -> tuple[Run, Path]:
    """A bench against a scripted engine; ``act`` on the engine once the first point is
    in results.json."""
    from tests.unit.engine_standin import scripted_engine

    out = c.p("out")
    with scripted_engine(tokenizer=c.shared.tiny / "tokenizer.json") as (url, engine):
        t0 = time.monotonic()
        proc = start(c, *bench_args(c, url, out, *extra))
        if wait_for(lambda: bool(points(out)), 20):
            act(engine)
        r = finish(proc, BOUND_S - (time.monotonic() - t0), t0)
        with contextlib.suppress(ProcessLookupError):
            engine.send_signal(signal.SIGCONT)
    return r, out


@case("server process dies after the first point (`--url`)", "fail, keep finished points")
def _(c: Ctx) -> Verdict:
    r, out = fault_mid_sweep(c, lambda e: e.kill())
    kept = [p for p in points(out) if p.get("valid")]
    return first(expect(r, 1), None if kept else "the finished point was not kept")


@case("server SIGSTOP mid-sweep (`--url`, `--stall 6s`)", "fail soon")
def _(c: Ctx) -> Verdict:
    r, _out = fault_mid_sweep(c, lambda e: e.send_signal(signal.SIGSTOP), "--stall", "6s")
    return expect(r, 1)


@contextlib.contextmanager
def deployment(c: Ctx, name: str = "dep") -> Iterator[tuple[Run, dict[str, str]]]:
    """tiny-mixed up on this machine with the stand-in vLLM package; taken down after."""
    env = standin_env(c)
    u = c.sb("up", "tiny-mixed", "--name", name, "--timeout", "25", env=env, timeout=30)
    try:
        yield u, env
    finally:
        for pid in role_pids(c, name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        c.sb("down", name, env=env, timeout=30)


def role_pids(c: Ctx, name: str) -> list[int]:
    f = c.home / "deployments" / name / "state.json"
    if not f.exists():
        return []
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return [int(r["pid"]) for r in json.loads(f.read_text())["roles"] if r.get("pid")]
    return []


def dep_bench(c: Ctx, name: str, out: Path, *extra: str) -> list[str | Path]:
    return ["bench", name, *bench_args(c, "", out, *extra)[3:]]


# --- real engines (--engines) --------------------------------------------------------------
#
# A case below with needs="engines" starts real vLLM CPU engines through servebook, as the
# probe did.  Everything a case's servebook starts inherits the case's own SERVEBOOK_HOME:
# that marker, read from /proc/PID/environ, is how a case finds what it started (after a
# SIGKILL too, when its engines are no longer servebook's children) and the only processes
# its clean-up may signal.


def _alive(pid: int) -> bool:
    """A process, not its zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def vllm_groups() -> set[int]:
    """Process groups of the vLLM API servers running on this machine, anyone's."""
    groups = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if b"vllm.entrypoints" in (d / "cmdline").read_bytes() and _alive(int(d.name)):
                    groups.add(os.getpgid(int(d.name)))
    return groups


def quiet_machine() -> str | None:
    """Waits (at most ``MODE.engine_wait_s``) until at most one other vLLM server group
    runs here: the machine's cores are shared.  None, or why the case is not re-run."""
    deadline = time.monotonic() + MODE.engine_wait_s
    said = False
    while (n := len(vllm_groups())) > 1:
        if time.monotonic() > deadline:
            return (
                f"{n} other vLLM server groups still ran after {MODE.engine_wait_s:.0f} s of "
                "waiting: no engine started beside them"
            )
        if not said:
            sys.stderr.write(f"waiting: {n} other vLLM server groups run on this machine\n")
            said = True
        time.sleep(5)
    return None


def ours(c: Ctx) -> list[int]:
    """Live processes started under this case's SERVEBOOK_HOME (its servebook commands,
    their engines and the engines' children), wherever they were reparented."""
    mark = f"SERVEBOOK_HOME={c.home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in (d / "environ").read_bytes().split(b"\0") and _alive(int(d.name)):
                    found.append(int(d.name))
    return found


def stop_ours(c: Ctx) -> None:
    """The clean-up of an engine case: SIGTERM, then SIGKILL after 10 s, to exactly the
    processes ``ours`` finds, nothing else."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = ours(c)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if wait_for(lambda: not ours(c), 10):
            return


def engine_case(c: Ctx, *names: str) -> None:
    """Registers an engine case's clean-up: ``servebook down NAME`` for each deployment it
    names, then whatever it started that is still running."""
    c.cleanups.append(lambda: stop_ours(c))

    def down(name: str) -> Callable[[], None]:
        def undo() -> None:
            c.sb("down", name, timeout=120)

        return undo

    c.cleanups += [down(name) for name in names]


class Tracked:
    """One servebook command of an engine case, started in a session of its own as a shell
    starts a command, its output in files (a pipe nobody reads would block it)."""

    def __init__(
        self, c: Ctx, *args: str | Path, env: dict[str, str] | None = None, label: str = "sb"
    ) -> None:
        # No MEMORY_BOUND: the engines inherit it, and vLLM (torch) aborts under 3 GiB of
        # address space ("cannot allocate memory for thread-local data").
        code = "from servebook.entry import main\nmain()"
        self.argv = [sys.executable, "-c", code, *map(str, args)]
        full = {**os.environ, "SERVEBOOK_HOME": str(c.home), "COLUMNS": "200", **(env or {})}
        full["PYTHONPATH"] = this_checkout(full.get("PYTHONPATH"))
        for name in ("OPENAI_API_KEY", "VLLM_API_KEY"):
            if name not in (env or {}):
                full.pop(name, None)
        self.out, self.err = c.p(f"{label}.out"), c.p(f"{label}.err")
        with self.out.open("w") as o, self.err.open("w") as e:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                env=full,
                cwd=c.root,
                start_new_session=True,
            )
        self.t0 = time.monotonic()
        self.c = c
        c.cleanups.append(lambda: kill_group(self.proc))

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, pred: Callable[[], bool], bound: float) -> bool:
        """Until ``pred()`` (True), or the command ends or ``bound`` seconds pass (False)."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if pred():
                return True
            if self.ended():
                return pred()
            time.sleep(0.3)
        return False

    def signal(self, sig: signal.Signals, *, group: bool = True) -> None:
        """To its whole process group, as a terminal's Ctrl-C, `timeout` and CI do; or to
        the servebook process alone (``kill -9 PID``)."""
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def finish(self, bound: float) -> Run:
        timed_out = False
        try:
            self.proc.wait(max(0.1, bound))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(self.proc)
        r = Run(
            [str(a) for a in self.argv[3:]],
            self.proc.returncode,
            self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
            time.monotonic() - self.t0,
            timed_out,
            bound,
        )
        last = r.err.strip().splitlines()[-1:] or r.out.strip().splitlines()[-1:]
        self.c.notes.append(
            f"`{' '.join(r.args[:1])} {' '.join(r.args[1:2])}` exit {r.rc} after "
            f"{r.seconds:.0f} s: {' '.join(' '.join(last).split())[:240]}"
        )
        return r


def state_of(c: Ctx, name: str) -> dict[str, Any]:
    f = c.home / "deployments" / name / "state.json"
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(f.read_text())
        if isinstance(doc, dict):
            return doc
    return {}


def engine_started(c: Ctx, name: str) -> bool:
    """Deployment ``name`` has an engine process running (recorded, alive), not yet ready."""
    pids = role_pids(c, name)
    return bool(pids) and all(_alive(p) for p in pids)


def up_args(
    c: Ctx, name: str, recipe: str | Path = "tiny-mixed", model: bool = True, timeout: int = 0
) -> list[str | Path]:
    """`up RECIPE --name NAME`, on the shared tiny model unless ``model`` is False (then
    the recipe's default: made by this up, in the case's SERVEBOOK_HOME)."""
    args: list[str | Path] = ["up", recipe, "--name", name]
    args += ["--timeout", str(timeout or ENGINE_UP_S)]
    return args + (["--set", f"model_dir={c.shared.tiny}"] if model else [])


def run_args(c: Ctx, name: str, out: Path) -> list[str | Path]:
    """The main job on tiny-mixed, its sweep as short as run allows (3 repetitions)."""
    return [
        "run", "tiny-mixed", "--name", name, "--set", f"model_dir={c.shared.tiny}",
        "--timeout", str(ENGINE_UP_S), "--max-repetitions", "3", "-o", out,
    ]  # fmt: skip


def nothing_left(c: Ctx, name: str) -> Verdict:
    """No process of the case runs (after up to 30 s), and no record: `down` has nothing
    to stop."""
    wait_for(lambda: not ours(c), 30)
    left = ours(c)
    d = c.sb("down", name, timeout=120)
    c.notes.append(f"then: {len(left)} process(es) left; `down {name}` exit {d.rc}: {d.text[:120]}")
    return first(
        f"processes left running: {left}" if left else None,
        expect(d, 0, says=["nothing to stop"]),
    )


def interrupted_before_ready(
    c: Ctx, t: Tracked, name: str, sig: signal.Signals, *, group: bool = True
) -> Run | str:
    """Signals ``t`` once deployment ``name``'s engine runs, before it is ready; its end,
    or what went wrong before the signal."""
    if not t.wait(lambda: engine_started(c, name), 120):
        r = t.finish(1)
        return f"no engine of {name} was seen running within 120 s | {r.text[:300]}"
    time.sleep(STARTING_S)  # well into its start: importing torch, loading the model
    if t.ended() or not engine_started(c, name):
        r = t.finish(1)
        return f"{name}'s engine or `{r.args[0]}` ended before the signal | {r.text[-400:]}"
    if state_of(c, name).get("ready"):
        return f"{name} was ready before the signal could come"
    t.signal(sig, group=group)
    return t.finish(150)


@case(
    "engine SIGSTOP: `status` / `verify` / `bench`", "not ok / fail with evidence / fail soon", n=3
)
def _(c: Ctx) -> list[Verdict]:
    with deployment(c) as (u, env):
        if u.rc != 0:
            return [expect(u, 0)] * 3
        for pid in role_pids(c, "dep"):
            os.kill(pid, signal.SIGSTOP)
        st = c.sb("status", "dep", env=env)
        ve = c.sb("verify", "dep", env=env, timeout=30)
        out = c.p("out")
        b = c.sb(*one_level(dep_bench(c, "dep", out)), *STALL, env=env, timeout=30)
    return [expect(st, 1), expect(ve, 1), expect(b, (1, 2))]


@case("engine kill -9 mid-bench", "stop, exit 1, keep points; then status/verify/down", n=4)
def _(c: Ctx) -> list[Verdict]:
    with deployment(c) as (u, env):
        if u.rc != 0:
            return [expect(u, 0)] * 4
        out = c.p("out")
        t0 = time.monotonic()
        proc = start(c, *dep_bench(c, "dep", out, "--concurrency", "1,2,3"), env=env)
        pids = role_pids(c, "dep")
        if wait_for(lambda: bool(points(out)), 20):
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        b = finish(proc, BOUND_S - (time.monotonic() - t0), t0)
        st = c.sb("status", "dep", env=env)
        ve = c.sb("verify", "dep", env=env, timeout=30)
        dn = c.sb("down", "dep", env=env, timeout=30)
    kept = points(out)
    return [
        first(expect(b, 1, says=["not running"]), None if kept else "no point kept"),
        expect(st, 1),
        expect(ve, 1),
        expect(dn, 0),
    ]


def mid_size(c: Ctx) -> int:
    """A size between a quick sweep's results.json after its first point and at its end
    (measured on a run of its own): a limit there fails the second write."""
    out = c.p("measure")
    c.sb(*bench_args(c, c.shared.url, out), timeout=30)
    f = out / "results.json"
    if not f.exists():
        return 0
    text = f.read_text()
    doc = json.loads(text)
    doc["points"] = doc["points"][:1]
    doc["aggregates"] = [a for a in doc.get("aggregates", []) if a.get("concurrency") == 1]
    one = len(json.dumps(doc, indent=2 if "\n " in text else None))
    return (one + len(text)) // 2


@case("disk full mid-bench (a file-size limit standing in)", "named error, file intact")
def _(c: Ctx) -> Verdict:
    size = mid_size(c)
    if not size:
        return "the measuring run wrote no results.json"
    out = c.p("out")
    prelude = [
        "import resource, signal",
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)",
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, {size}))",
    ]
    r = c.sb(*bench_args(c, c.shared.url, out), prelude=prelude, timeout=30)
    return first(expect(r, (1, 2), names=["results.json"]), results_intact(out))


@case("`-o` not writable from the start", "exit 2 before load")
def _(c: Ctx) -> Verdict:
    ro = c.p("ro")
    ro.mkdir()
    ro.chmod(0o555)
    n0 = c.shared.completions()
    r = c.sb(*bench_args(c, c.shared.url, ro / "r"), no_dac=True)
    sent = c.shared.completions() - n0
    return expect(r, names=[ro / "r"]) or (f"{sent} completions sent first" if sent else None)


@case("`-o` made read-only mid-run", "named error")
def _(c: Ctx) -> Verdict:
    out = c.p("out")
    t0 = time.monotonic()
    proc = start(c, *bench_args(c, c.shared.url, out, "--concurrency", "1,2,3"), no_dac=True)
    if wait_for(lambda: bool(points(out)), 20):
        out.chmod(0o555)
    r = finish(proc, BOUND_S - (time.monotonic() - t0), t0)
    out.chmod(0o755)
    return first(expect(r, (1, 2), names=[out]), results_intact(out))


@case("`report` to unwritable `-o` / full disk", "exit 2, nothing partial", n=2)
def _(c: Ctx) -> list[Verdict]:
    run = results_dir(c, "run")
    ro = c.p("ro")
    ro.mkdir()
    ro.chmod(0o555)
    r1 = c.sb("report", run, "-o", ro / "rep" / "r.html", no_dac=True)
    prelude = [
        "import resource, signal",
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)",
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))",
    ]
    rep = c.p("rep")
    r2 = c.sb("report", run, "-o", rep / "r.html", prelude=prelude)
    left = [str(p.relative_to(rep)) for p in rep.rglob("*") if p.is_file()] if rep.exists() else []
    partial = left and not (rep / "r.html").exists()
    return [
        expect(r1, names=[ro]),
        first(expect(r2), f"left {left} without a report" if partial else None),
    ]


@case("`compare -o` an existing file", "exit 2")
def _(c: Ctx) -> Verdict:
    a = results_dir(c, "a")
    b = results_dir(c, "b", redated(results_doc()))
    f = c.p("file")
    f.write_text("x\n")
    return expect(c.sb("compare", a, b, "-o", f), names=[f])


LONG = ("--concurrency", "1,2", "--repetitions", "3", "--duration", "2s")


def long_bench(c: Ctx, out: Path, *extra: str) -> list[str | Path]:
    args = bench_args(c, c.shared.url, out, *extra)
    for flag, value in zip(LONG[::2], LONG[1::2], strict=True):
        args[args.index(flag) + 1] = value
    return args


@case("Ctrl-C bench at 0.5, 2, 9, 14 s", "130, points kept, resumable", n=4)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for t in (0.5, 2, 9, 14):
        d = c.p(f"out-{t}")
        t0 = time.monotonic()
        proc = start(c, *long_bench(c, d))
        time.sleep(t)
        if proc.poll() is not None:
            out.append(f"bench had already ended at {t} s (exit {proc.returncode})")
            continue
        proc.send_signal(signal.SIGINT)
        r = finish(proc, 20, t0)
        v = expect(r, 130)
        if v is None and (d / "results.json").exists():
            v = results_intact(d)
        out.append(v)
    return out


@case("`--resume` after Ctrl-C", "continues")
def _(c: Ctx) -> Verdict:
    d = c.p("out")
    t0 = time.monotonic()
    proc = start(c, *long_bench(c, d))
    wait_for(lambda: len(points(d)) >= 2, 25)
    proc.send_signal(signal.SIGINT)
    first_run = finish(proc, 20, t0)
    before = len(points(d))
    r = c.sb(*long_bench(c, d, "--resume"), timeout=30)
    after = [p for p in points(d) if p.get("valid")]
    return first(
        expect(first_run, 130),
        expect(r, 0),
        None if len(after) == 6 else f"{len(after)} valid points after resume (from {before})",
    )


@case(
    "Ctrl-C `up` (before ready)",
    "clean: exit 130, no process, no record",
    needs="engines",
    why_not=_UP,
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "intup")
    r = interrupted_before_ready(c, Tracked(c, *up_args(c, "intup")), "intup", signal.SIGINT)
    if isinstance(r, str):
        return r
    return first(expect(r, 130, says=["Ctrl-C"]), nothing_left(c, "intup"))


@case(
    "Ctrl-C `run` during up", "clean: exit 130, no process, no record", needs="engines", why_not=_UP
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "intrun")
    t = Tracked(c, *run_args(c, "intrun", c.p("out")))
    r = interrupted_before_ready(c, t, "intrun", signal.SIGINT)
    if isinstance(r, str):
        return r
    return first(expect(r, 130, says=["Ctrl-C"]), nothing_left(c, "intrun"))


@case(
    "Ctrl-C `run` during bench; its partial report marked partial",
    "exit 130, taken down, the points kept with their report / the report says INCOMPLETE",
    n=2,
    needs="engines",
    why_not=_UP,
)
def _(c: Ctx) -> list[Verdict]:
    engine_case(c, "runbench")
    out = c.p("out")
    t = Tracked(c, *run_args(c, "runbench", out))
    if not t.wait(lambda: bool(points(out)), ENGINE_BOUND_S):
        r = t.finish(1)
        return [f"no point was measured within {ENGINE_BOUND_S:.0f} s | {r.text[-400:]}"] * 2
    t.signal(signal.SIGINT)
    r = t.finish(180)
    md = out / "report.md"
    kept = len(points(out))
    return [
        first(
            expect(r, 130, says=["taken down", "Their report"]),
            None if kept else "no point kept",
            None if (out / "report.html").is_file() else "no report.html",
            nothing_left(c, "runbench"),
        ),
        None
        if md.is_file() and "INCOMPLETE" in md.read_text()
        else f"report.md ({'present' if md.is_file() else 'absent'}) does not say INCOMPLETE",
    ]


@case("SIGTERM `up`", "clean: exit 143, no process, no record", needs="engines", why_not=_UP)
def _(c: Ctx) -> Verdict:
    engine_case(c, "sigterm")
    r = interrupted_before_ready(c, Tracked(c, *up_args(c, "sigterm")), "sigterm", signal.SIGTERM)
    if isinstance(r, str):
        return r
    return first(expect(r, 143, says=["SIGTERM"]), nothing_left(c, "sigterm"))


@case(
    "SIGKILL `up`",
    "`down` recovers: stops the engine, removes the record",
    needs="engines",
    why_not=_UP,
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "sigkill")
    t = Tracked(c, *up_args(c, "sigkill"))
    r = interrupted_before_ready(c, t, "sigkill", signal.SIGKILL, group=False)
    if isinstance(r, str):
        return r
    orphans = ours(c)  # up is gone; its engine is not
    d = c.sb("down", "sigkill", timeout=120)
    c.notes.append(f"{len(orphans)} process(es) outlived up; `down sigkill` exit {d.rc}")
    return first(
        None if r.rc == -signal.SIGKILL else f"up ended with {r.rc}, not by the SIGKILL",
        None if orphans else "no engine outlived the SIGKILL of up: nothing for down to recover",
        expect(d, 0, says=["down:"]),
        nothing_left(c, "sigkill"),
    )


@case("SIGINT/TERM/KILL of `bench --agents 2`", "no orphan agents, rc 130/143/137", n=3)
def _(c: Ctx) -> list[Verdict]:
    out: list[Verdict] = []
    for sig, rc in ((signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)):
        d = c.p(f"out-{sig.name}")
        t0 = time.monotonic()
        proc = start(c, *long_bench(c, d, "--agents", "2"))
        wait_for(lambda p=proc: len(session_pids(p.pid)) > 1, 10)  # type: ignore[misc]
        time.sleep(1)
        proc.send_signal(sig)
        r = finish(proc, 20, t0)
        wait_for(lambda p=proc: not session_pids(p.pid), 10)  # type: ignore[misc]
        left = session_pids(proc.pid)
        kill_group(proc)
        code = expect(r, rc) if sig != signal.SIGKILL else None
        out.append(first(code, f"processes left: {left}" if left else None))
    return out


@case(
    "re-run after interrupted `up`/`run`",
    "works: up of the same name comes up",
    needs="engines",
    why_not=_UP,
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "again")
    t = Tracked(c, *run_args(c, "again", c.p("out")), label="run")
    r = interrupted_before_ready(c, t, "again", signal.SIGINT)
    if isinstance(r, str):
        return r
    u = Tracked(c, *up_args(c, "again"), label="up").finish(ENGINE_BOUND_S)
    d = c.sb("down", "again", timeout=120)
    return first(expect(r, 130), expect(u, 0, says=["up:"]), expect(d, 0), nothing_left(c, "again"))


@case(
    "`up --timeout 5` on tiny-pd",
    "fails (exit 1, both roles' log tails), stops all",
    needs="engines",
    why_not="a local tiny-pd deployment of real engines: " + ENGINES_WHY,
)
def _(c: Ctx) -> Verdict:
    engine_case(c, "pdto")
    r = Tracked(c, *up_args(c, "pdto", "tiny-pd", timeout=5)).finish(180)
    return first(expect(r, 1, says=["timed out", "prefill", "decode"]), nothing_left(c, "pdto"))


# =========================================================================================
# Section 4: concurrency
# =========================================================================================

table("4", "concurrency")


@case("two `bench` to one `-o`", "one refused, the other's points whole")
def _(c: Ctx) -> Verdict:
    out = c.p("same")
    t0 = time.monotonic()
    a = start(c, *bench_args(c, c.shared.url, out, "--seed", "1"))
    wait_for(lambda: (out / "results.lock").exists(), 15)
    b = c.sb(*bench_args(c, c.shared.url, out, "--seed", "2"))
    ra = finish(a, BOUND_S - (time.monotonic() - t0), t0)
    f = out / "results.json"
    seed = json.loads(f.read_text())["provenance"]["seed"] if f.exists() else None
    return first(
        expect(b, 2, says=["another run"]),
        expect(ra, 0),
        None if seed == 1 else f"results.json holds seed {seed}'s run",
    )


_RACE = "a race of two `up` of real engines: " + ENGINES_WHY


def up_race(c: Ctx, model: bool) -> Verdict:
    """Two `up` of one name started together; one must be refused (exit 2) naming the
    other, never "pass --force".  Model missing: the other makes the model and comes up
    (then `down`); model present: Ctrl-C of the other, once its engine runs, cleans all."""
    engine_case(c, "race")
    a = Tracked(c, *up_args(c, "race", model=model), label="a")
    b = Tracked(c, *up_args(c, "race", model=model), label="b")
    if not wait_for(lambda: a.ended() or b.ended(), 90):
        return "both `up` still ran after 90 s: neither was refused"
    loser, winner = (a, b) if a.ended() else (b, a)
    lost = loser.finish(5)
    reason = lost.has("another `servebook up`") or lost.has("already up")
    refused = first(
        expect(lost, 2, not_says=["--force"]),
        None if reason else f"the refusal names no other `up` | {lost.text[:300]}",
    )
    if model:
        r = interrupted_before_ready(c, winner, "race", signal.SIGINT)
        if isinstance(r, str):
            return first(refused, r)
        return first(refused, expect(r, 130), nothing_left(c, "race"))
    w = winner.finish(ENGINE_BOUND_S)
    d = c.sb("down", "race", timeout=120)
    return first(refused, expect(w, 0), expect(d, 0), nothing_left(c, "race"))


@case(
    "two `up` of one name, model missing",
    "one refused with a clear reason",
    needs="engines",
    why_not=_RACE,
)
def _(c: Ctx) -> Verdict:
    return up_race(c, model=False)


@case("two `up` of one name, model present", "one refused", needs="engines", why_not=_RACE)
def _(c: Ctx) -> Verdict:
    return up_race(c, model=True)


@case("`down` while `bench` runs", "bench stops, exit 1")
def _(c: Ctx) -> Verdict:
    with deployment(c) as (u, env):
        if u.rc != 0:
            return expect(u, 0)
        out = c.p("out")
        t0 = time.monotonic()
        proc = start(c, *dep_bench(c, "dep", out, "--concurrency", "1,2,3"), env=env)
        if wait_for(lambda: bool(points(out)), 20):
            c.sb("down", "dep", env=env, timeout=20)
        r = finish(proc, BOUND_S - (time.monotonic() - t0), t0)
    return first(expect(r, 1, says=["not running"]), None if points(out) else "no point kept")


# =========================================================================================
# running and counting
# =========================================================================================


def run_case(case: Case, shared: Shared, scratch: Path) -> Outcome:
    if case.fn is None or (case.needs == "engines" and not MODE.engines):
        return Outcome(case, [Skip(case.why_not or "")] * case.n, 0.0)
    root = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    t0 = time.monotonic()
    bound = BOUND_S
    if case.needs == "engines":
        bound = ENGINE_BOUND_S
    elif case.long and MODE.slow:
        bound = LONG_BOUND_S
    ctx = Ctx(root, shared, bound=bound)
    try:
        busy = quiet_machine() if case.needs == "engines" else None
        got = Skip(busy) if busy else case.fn(ctx)
    except Exception as e:  # the harness's own failure is a failed case, said as such
        got = f"the re-run itself failed: {type(e).__name__}: {e}"
    finally:
        for undo in reversed(ctx.cleanups):
            with contextlib.suppress(Exception):
                undo()
        for d in root.rglob("*"):  # mode-000 files of the caps cases
            with contextlib.suppress(OSError):
                if not d.is_symlink():
                    d.chmod(0o700)
        shutil.rmtree(root, ignore_errors=True)
    verdicts = list(got) if isinstance(got, list) else [got] * case.n
    if len(verdicts) != case.n:
        verdicts = [f"the re-run gave {len(verdicts)} verdicts for {case.n} cases"] * case.n
    return Outcome(case, verdicts, time.monotonic() - t0, ctx.notes)


def tally(outcomes: Sequence[Outcome]) -> dict[str, int]:
    vs = [v for o in outcomes for v in o.verdicts]
    skipped = sum(isinstance(v, Skip) for v in vs)
    failed = sum(isinstance(v, str) for v in vs)
    return {
        "cases": len(vs),
        "tried": len(vs) - skipped,
        "held": sum(v is None for v in vs),
        "failed": failed,
        "not_rerun": skipped,
    }


def as_doc(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    sections = {}
    for key, title in SECTIONS.items():
        mine = [o for o in outcomes if o.case.section == key]
        if mine:
            sections[key] = {"title": title, **tally(mine)}
    rows = []
    for o in outcomes:
        rows.append(
            {
                "section": o.case.section,
                "table": o.case.table,
                "row": o.case.row,
                "expected": o.case.expected,
                "cases": o.case.n,
                "seconds": round(o.seconds, 2),
                **({"notes": o.notes} if o.notes else {}),
                "verdicts": [
                    "held"
                    if v is None
                    else {"not_rerun": v.why}
                    if isinstance(v, Skip)
                    else {"failed": v}
                    for v in o.verdicts
                ],
            }
        )
    return {"total": tally(outcomes), "sections": sections, "rows": rows}


def print_text(outcomes: Sequence[Outcome]) -> None:
    out = sys.stdout
    out.write("Reliability probe of 2026-12-04, re-run on this checkout\n\n")
    out.write(f"{'':34} {'tried':>6} {'held':>6} {'failed':>7} {'not re-run':>11}\n")
    for key, title in SECTIONS.items():
        mine = [o for o in outcomes if o.case.section == key]
        if mine:
            t = tally(mine)
            out.write(
                f"{title:34} {t['tried']:>6} {t['held']:>6} {t['failed']:>7} {t['not_rerun']:>11}\n"
            )
    t = tally(outcomes)
    out.write(
        f"{'Total (' + str(t['cases']) + ' cases)':34} {t['tried']:>6} {t['held']:>6} "
        f"{t['failed']:>7} {t['not_rerun']:>11}\n"
    )
    failed = [o for o in outcomes if any(isinstance(v, str) for v in o.verdicts)]
    if failed:
        out.write("\nFailed cases:\n")
    for o in failed:
        out.write(f"\n* [{SECTIONS[o.case.section]} / {o.case.table}] {o.case.row}\n")
        out.write(f"  expected: {o.case.expected}\n")
        for i, v in enumerate(o.verdicts):
            if isinstance(v, str):
                label = f"  case {i + 1}/{o.case.n}: " if o.case.n > 1 else "  observed: "
                out.write(label + v + "\n")
    skipped = [o for o in outcomes if any(isinstance(v, Skip) for v in o.verdicts)]
    if skipped:
        out.write("\nNot re-run:\n")
    for o in skipped:
        whys = sorted({v.why for v in o.verdicts if isinstance(v, Skip)})
        k = sum(isinstance(v, Skip) for v in o.verdicts)
        out.write(f"* [{SECTIONS[o.case.section]}] {o.case.row} ({k}): {'; '.join(whys)}\n")


def select(pattern: str | None, sections: Sequence[str]) -> list[Case]:
    chosen = [c for c in CASES if not sections or c.section in sections]
    if pattern:
        chosen = [c for c in chosen if pattern.lower() in f"{c.table} {c.row}".lower()]
    order = list(SECTIONS)
    return sorted(chosen, key=lambda c: order.index(c.section))


def run_cases(
    cases: Sequence[Case], progress: Callable[[Outcome], None] | None = None
) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="sb-rerun-") as tmp:
        shared = Shared(Path(tmp) / "shared")
        shared.root.mkdir()
        scratch = Path(tmp) / "cases"
        scratch.mkdir()
        outcomes = []
        try:
            for c in cases:
                o = run_case(c, shared, scratch)
                outcomes.append(o)
                if progress:
                    progress(o)
        finally:
            shared.close()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the tally and every row as JSON")
    ap.add_argument("-k", metavar="TEXT", help="only rows whose table or row contains TEXT")
    ap.add_argument(
        "--section", action="append", choices=list(SECTIONS), default=[], help="only this section"
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument(
        "--engines",
        action="store_true",
        help="also re-run the cases that need real vLLM engines (tiny-mixed, tiny-pd: "
        "minutes each on a 2-core machine); implies --slow",
    )
    ap.add_argument(
        "--slow",
        action="store_true",
        help=f"give the long cases (the 50 MB lint) {LONG_BOUND_S:.0f} s instead of "
        f"{BOUND_S:.0f} s",
    )
    ap.add_argument(
        "--only-gated",
        action="store_true",
        help="only the cases --engines and --slow change",
    )
    ap.add_argument(
        "--engine-wait",
        type=float,
        default=MODE.engine_wait_s,
        metavar="S",
        help="the most seconds an engine case waits until at most one other vLLM server "
        "group runs on this machine (then it is not re-run)",
    )
    args = ap.parse_args(argv)
    MODE.engines = args.engines
    MODE.slow = args.slow or args.engines
    MODE.engine_wait_s = args.engine_wait
    cases = select(args.k, args.section)
    if args.only_gated:
        cases = [c for c in cases if c.needs or c.long]

    def progress(o: Outcome) -> None:
        mark = "".join(
            "." if v is None else "s" if isinstance(v, Skip) else "F" for v in o.verdicts
        )
        sys.stderr.write(f"{o.seconds:6.1f}s {mark:6} {o.case.table[:30]:30} {o.case.row[:70]}\n")

    outcomes = run_cases(cases, None if args.quiet else progress)
    if args.json:
        json.dump(as_doc(outcomes), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print_text(outcomes)
    return 1 if tally(outcomes)["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
