"""Precision and recall of `servebook lint` on a corpus of the field's serving manifests.

The corpus (``tests/unit/fixtures/lint/corpus/``) holds small manifests, values files and
READMEs shaped like those of llm-d, NVIDIA Dynamo, KServe, AIBrix, vLLM production-stack,
LeaderWorkerSet and OME; ``verdicts.yaml`` beside it says, per file, where each original
came from and every finding a reader of the file judged: ``verdict: true`` (a real trap
lint must report) or ``false`` (a false finding, with its class), and each real trap lint
used to miss (``miss: M1`` ...).  ``mode`` says whether a judgment holds when the file is
linted alone (``file``), with its directory (``dir``), or both (the default).

Lint runs through the command line (``servebook lint --json``, in process): once per file,
and once per project directory (directory runs pair objects across files and compare docs
with the manifests around them).  A finding is matched by (file, check id, line).

A second corpus, ``heldout/``, was assembled independently from the same projects (other
guides, releases, values files, overlays) and judged before lint was run on it, so that the
rules are not only scored on the files their author tuned them on (issue 22's Done-when).
Both are scored the same way and printed side by side; ``--corpus DIR`` scores only the
given corpus directories (repeatable).

Run: ``.venv/bin/python benchmarks/lint_corpus.py [--corpus DIR] [--json] [--write-table]``
(the last renders each corpus's ``VERDICTS.md`` from its ``verdicts.yaml``).  Exit 1 when a
corpus's precision is under 95%, a miss class is not caught or an expected finding is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "unit" / "fixtures" / "lint"
CORPUS = FIXTURES / "corpus"
HELDOUT = FIXTURES / "heldout"
VERDICTS_NAME = "verdicts.yaml"
TABLE_NAME = "VERDICTS.md"
VERDICTS = CORPUS / VERDICTS_NAME
TABLE = CORPUS / TABLE_NAME
PRECISION_TARGET = 0.95
Key = tuple[str, str, int]  # (file relative to the corpus, check id, line)


@dataclass
class Run:
    """One `servebook lint --json` call and how its findings compare with the verdicts."""

    target: str
    mode: str  # "file" or "dir"
    exit_code: int
    unreadable: bool
    reported: list[Key] = field(default_factory=list)
    severities: dict[Key, str] = field(default_factory=dict)
    true_hits: list[Key] = field(default_factory=list)
    false_hits: list[tuple[Key, str]] = field(default_factory=list)  # (key, class or "unjudged")
    misses: list[tuple[Key, str]] = field(default_factory=list)  # (key, miss class or "")


def load_verdicts(path: Path = VERDICTS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def corpus_files(root: Path = CORPUS) -> list[str]:
    skip = {VERDICTS_NAME, TABLE_NAME}
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name not in skip
    )


def _invoke(target: Path) -> tuple[int, dict[str, Any] | None]:
    from typer.testing import CliRunner

    from servebook.cli import app  # the application with every command registered
    from servebook.errors import ServebookError

    result = CliRunner().invoke(app, ["lint", "--json", str(target)])
    if isinstance(result.exception, ServebookError):
        # What servebook.cli.main turns into its message and exit code (2: unreadable).
        return result.exception.exit_code, None
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"servebook lint crashed on {target}") from result.exception
    try:
        return result.exit_code, json.loads(result.stdout)
    except (json.JSONDecodeError, ValueError):
        return result.exit_code, None


def _relative(file: str, root: Path) -> str:
    p = Path(file)
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return file


def _entries(verdicts: dict[str, Any], files: list[str], mode: str) -> list[dict[str, Any]]:
    out = []
    for name in files:
        for e in (verdicts["files"].get(name) or {}).get("findings") or []:
            if e.get("mode", "both") in (mode, "both"):
                out.append({**e, "file": name})
    return out


def score_run(
    target: str, mode: str, files: list[str], verdicts: dict[str, Any], root: Path = CORPUS
) -> Run:
    code, doc = _invoke(root / target)
    run = Run(target, mode, code, doc is None)
    if doc is not None:
        for f in doc["findings"]:
            ev = f.get("evidence") or {}
            key = (_relative(str(ev.get("file", "")), root), f["check"], int(ev.get("line", 0)))
            run.reported.append(key)
            run.severities[key] = f["severity"]
    entries = _entries(verdicts, files, mode)
    judged = {(e["file"], e["check"], int(e["line"])): e for e in entries}
    for key in run.reported:
        e = judged.get(key)
        if e is not None and e["verdict"]:
            run.true_hits.append(key)
        else:
            run.false_hits.append((key, e.get("class", "?") if e else "unjudged"))
    seen = Counter(run.reported)
    for key, e in judged.items():
        if e["verdict"] and not seen[key]:
            run.misses.append((key, e.get("miss", "")))
    return run


def score(verdicts: dict[str, Any] | None = None, root: Path = CORPUS) -> list[Run]:
    verdicts = verdicts or load_verdicts(root / VERDICTS_NAME)
    files = corpus_files(root)
    runs = [score_run(name, "file", [name], verdicts, root) for name in files]
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        inside = [f for f in files if f.startswith(d.name + "/")]
        runs.append(score_run(d.name, "dir", inside, verdicts, root))
    return runs


def summary(runs: list[Run], verdicts: dict[str, Any]) -> dict[str, Any]:
    tp = sum(len(r.true_hits) for r in runs)
    fp = sum(len(r.false_hits) for r in runs)
    fn = sum(len(r.misses) for r in runs)
    false_classes: dict[str, int] = dict.fromkeys(verdicts["classes"]["false_findings"], 0)
    for r in runs:
        for _, cls in r.false_hits:
            false_classes[cls] = false_classes.get(cls, 0) + 1
    miss_total: Counter[str] = Counter()
    miss_left: Counter[str] = Counter()
    for r in runs:
        for e in _entries(verdicts, [k for k in verdicts["files"]], r.mode):
            if e.get("miss") and (r.mode == "dir" or e["file"] == r.target):
                if r.mode == "dir" and not e["file"].startswith(r.target + "/"):
                    continue
                miss_total[e["miss"]] += 1
        for _, cls in r.misses:
            if cls:
                miss_left[cls] += 1
    return {
        "true_findings": tp,
        "false_findings": fp,
        "missed": fn,
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "false_classes": false_classes,
        "miss_classes": {
            m: {"expected": miss_total[m], "missed": miss_left[m]}
            for m in verdicts["classes"]["misses"]
        },
        "unreadable": [r.target for r in runs if r.unreadable],
        "runs": len(runs),
    }


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_table(verdicts: dict[str, Any]) -> str:
    """VERDICTS.md: the verdicts as a table, one row per judged finding (or per file)."""
    lines = [
        "# Lint corpus verdicts",
        "",
        "<!-- Generated from verdicts.yaml by `python benchmarks/lint_corpus.py --write-table`;"
        " tests/unit/test_lint_corpus.py fails when the two disagree. -->",
        "",
        "Each file is shaped like the named original (written for this corpus, not copied). "
        "A row is a finding lint must report (`true`), a false finding it must not report "
        "(`false`, with its class), or a trap it used to miss (miss class). Mode: `file` = "
        "the file linted alone, `dir` = its project directory linted at once.",
        "",
        "## Classes",
        "",
    ]
    for kind in ("false_findings", "misses"):
        for cls, title in verdicts["classes"][kind].items():
            lines.append(f"* **{cls}**: {_cell(title)}")
    lines += [
        "",
        "## Files",
        "",
        "| file | source | check | line | verdict | class | mode | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in sorted(verdicts["files"].items()):
        source = _cell(v.get("source", ""))
        entries = v.get("findings") or []
        if v.get("unreadable"):
            lines.append(
                f"| {name} | {source} | - | - | unreadable (exit 2) | | file | "
                f"{_cell(v.get('note', ''))} |"
            )
        if not entries and not v.get("unreadable"):
            lines.append(f"| {name} | {source} | - | - | no finding | | both | |")
        for e in entries:
            verdict = "true" if e["verdict"] else "false"
            cls = e.get("class") or e.get("miss") or ""
            lines.append(
                f"| {name} | {source} | {e['check']} | {e['line']} | {verdict} | {cls} | "
                f"{e.get('mode', 'both')} | {_cell(e.get('note', ''))} |"
            )
    return "\n".join(lines) + "\n"


def passes(s: dict[str, Any]) -> bool:
    """The bar each corpus is held to: precision, every miss class caught, nothing missed."""
    return (
        s["precision"] >= PRECISION_TARGET
        and not s["missed"]
        and all(v["expected"] and not v["missed"] for v in s["miss_classes"].values())
    )


def _report(root: Path, runs: list[Run], s: dict[str, Any], verdicts: dict[str, Any]) -> None:
    print(
        f"{root.name}: {len(corpus_files(root))} files, {s['runs']} lint runs "
        "(each file, each project dir)"
    )
    for r in runs:
        for (file, check, line), cls in r.false_hits:
            print(f"FALSE  [{r.mode} {r.target}] {check} {file}:{line} (class {cls})")
        for (file, check, line), cls in r.misses:
            print(f"MISSED [{r.mode} {r.target}] {check} {file}:{line} (class {cls or '-'})")
    for target in s["unreadable"]:
        print(f"UNREADABLE {target}: lint exited without JSON (exit 2), linted file by file")
    print(
        f"precision {s['precision']:.1%} ({s['true_findings']} true, {s['false_findings']} "
        f"false); recall {s['recall']:.1%} ({s['missed']} missed)"
    )
    for cls, n in s["false_classes"].items():
        title = verdicts["classes"]["false_findings"].get(cls, "")
        print(f"  false class {cls}: {'fixed' if not n else f'{n} still reported'}  {title}")
    for cls, v in s["miss_classes"].items():
        title = verdicts["classes"]["misses"][cls]
        status = "caught" if v["expected"] and not v["missed"] else f"missed {v['missed']}"
        print(f"  miss class {cls}: {status} (of {v['expected']})  {title}")
    print()


def _side_by_side(results: dict[str, tuple[int, dict[str, Any]]]) -> None:
    names = list(results)
    rows = [
        ("files", lambda n, s: str(n)),
        ("lint runs", lambda n, s: str(s["runs"])),
        ("precision", lambda n, s: f"{s['precision']:.1%}"),
        ("recall", lambda n, s: f"{s['recall']:.1%}"),
        ("true findings", lambda n, s: str(s["true_findings"])),
        ("false findings", lambda n, s: str(s["false_findings"])),
        ("missed", lambda n, s: str(s["missed"])),
        ("passes", lambda n, s: "yes" if passes(s) else "NO"),
    ]
    width = max(12, *(len(n) for n in names))
    print(f"{'':16}" + "".join(f"{n:>{width + 2}}" for n in names))
    for label, cell in rows:
        print(f"{label:16}" + "".join(f"{cell(*results[n]):>{width + 2}}" for n in names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.add_argument(
        "--write-table", action="store_true", help=f"write {TABLE_NAME} from {VERDICTS_NAME}"
    )
    parser.add_argument(
        "--corpus",
        action="append",
        type=Path,
        metavar="DIR",
        help=f"a corpus directory holding {VERDICTS_NAME} (repeatable; default: "
        f"{CORPUS.name}/ and {HELDOUT.name}/)",
    )
    args = parser.parse_args(argv)
    roots = args.corpus or [CORPUS, HELDOUT]
    results: dict[str, tuple[int, dict[str, Any]]] = {}
    ok = True
    for root in roots:
        if not (root / VERDICTS_NAME).is_file():
            parser.error(f"{root}: no {VERDICTS_NAME} (give a corpus directory)")
        verdicts = load_verdicts(root / VERDICTS_NAME)
        if args.write_table:
            (root / TABLE_NAME).write_text(render_table(verdicts), encoding="utf-8")
        runs = score(verdicts, root)
        s = summary(runs, verdicts)
        ok = ok and passes(s)
        results[root.name] = (len(corpus_files(root)), s)
        if not args.json:
            _report(root, runs, s, verdicts)
    if args.json:
        print(json.dumps({name: s for name, (_, s) in results.items()}, indent=2))
    else:
        _side_by_side(results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
