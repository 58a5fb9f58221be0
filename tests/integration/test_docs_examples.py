"""The user documentation's examples are real: every YAML snippet is a file under ``examples/``,
every such file validates strictly against the Kubernetes 1.34 and 1.37 schemas, and every
documented ``biaxial simulate`` result is what the simulator prints.

Conventions the docs follow (and these tests enforce):

* A fenced ``yaml`` block is the complete text of one file under ``examples/``.
* A fenced ``sh`` block holding exactly one ``biaxial simulate INVENTORY EXAMPLE [--FLAG]`` line,
  followed by a ``| pod | node | GPUs |`` table, documents that run's result: one row per pod,
  in placement order; GPUs comma-separated in the order the simulator lists them; an
  unschedulable or skipped pod has node ``—`` and a fragment of its reason in the third
  column.
* Every other ``biaxial simulate`` line in a ``sh`` block (quick start) must run successfully.

Scope: the docs this suite owns (:data:`DOCS`). ``docs/sharing.md``, ``docs/scoring.md`` and
``docs/architecture.md`` are written by other components' owners and hold configuration
fragments (a ``GpuConfig`` alone, formulas) rather than complete example files.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main as biaxial_main
from tests.validate_manifests import OWN_API_VERSIONS, validate_object

ROOT = Path(__file__).resolve().parents[2]
DOCS = tuple(
    ROOT / "docs" / f"{name}.md"
    for name in (
        "quickstart",
        "requesting-gpus",
        "policies",
        "operations",
        "migration",
        "simulator",
    )
)
EXAMPLE_DIRS = (
    ROOT / "examples" / "requesting-gpus",
    ROOT / "examples" / "migration",
    ROOT / "examples" / "rules",
    ROOT / "examples" / "dynamic-mig",
)
VERSIONS = ("1.34", "1.37")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Block:
    doc: Path
    lang: str
    text: str
    end: int  # offset just after the closing fence

    def where(self) -> str:
        line = self.doc.read_text(encoding="utf-8")[: self.end].count("\n") + 1
        return f"{self.doc.relative_to(ROOT)}:{line}"


def _blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    return [Block(doc, m.group(1), m.group(2), m.end()) for m in FENCE.finditer(text)]


def _example_files() -> list[Path]:
    return sorted(p for d in EXAMPLE_DIRS for p in d.glob("*.yaml"))


def _simulate_json(args: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = biaxial_main(["simulate", *args, "-o", "json"])
    assert code == 0, f"biaxial simulate {' '.join(args)} exited {code}"
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


# --------------------------------------------------------------------------- snippets = files


def test_every_owned_doc_exists_and_has_examples() -> None:
    for doc in DOCS:
        assert doc.is_file(), doc
    assert sum(1 for doc in DOCS for b in _blocks(doc) if b.lang == "yaml") >= 15


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_yaml_block_is_an_example_file(doc: Path) -> None:
    files = {p: p.read_text(encoding="utf-8") for p in (ROOT / "examples").rglob("*.yaml")}
    for block in _blocks(doc):
        if block.lang != "yaml":
            continue
        matches = [p for p, text in files.items() if text.rstrip("\n") == block.text.rstrip("\n")]
        assert matches, f"{block.where()}: this yaml block is not the text of any examples/ file"


def test_every_example_file_is_shown_in_the_docs() -> None:
    shown = {b.text.rstrip("\n") for doc in DOCS for b in _blocks(doc) if b.lang == "yaml"}
    missing = [
        str(p.relative_to(ROOT))
        for p in _example_files()
        if p.read_text(encoding="utf-8").rstrip("\n") not in shown
    ]
    assert not missing, f"example files no doc shows: {missing}"


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_validates_strictly(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs, f"{path}: no documents"
    checked = 0
    for obj in docs:
        if obj.get("apiVersion") in OWN_API_VERSIONS:
            continue  # the inventory: biaxial simulate parses it strictly below
        checked += 1
        for version in VERSIONS:
            assert validate_object(obj, version) == [], (path, version)
    assert checked or path.name == "cluster.yaml"


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_header_names_its_own_simulate_command(path: Path) -> None:
    if path.name == "cluster.yaml":
        return
    header = [line for line in path.read_text(encoding="utf-8").splitlines() if line[:1] == "#"]
    commands = [line.lstrip("# ") for line in header if "biaxial simulate" in line]
    assert len(commands) == 1, f"{path}: one '#   biaxial simulate ...' line expected"
    args = shlex.split(commands[0])[2:]
    assert args[-1] == str(path.relative_to(ROOT)), commands[0]
    assert (ROOT / args[0]).is_file(), commands[0]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", [*DOCS, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        assert resolved.exists(), f"{doc.name}: broken link {target}"
        if anchor and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", resolved.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{doc.name}: no anchor {target}"


# --------------------------------------------------------------------------- documented results


@dataclass(frozen=True, slots=True)
class Documented:
    where: str
    args: list[str]
    rows: list[tuple[str, str, str]]


def _documented_runs() -> list[Documented]:
    runs: list[Documented] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in _blocks(doc):
            lines = block.text.strip().splitlines()
            if block.lang != "sh" or len(lines) != 1 or not lines[0].startswith("biaxial simulate"):
                continue
            after = text[block.end :].lstrip("\n").splitlines()
            table = f"{block.where()}: a one-line simulate block must be followed by its table"
            assert after, table
            assert after[0].replace(" ", "") == "|pod|node|GPUs|", table
            rows = []
            for line in after[2:]:
                if not line.startswith("|"):
                    break
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                assert len(cells) == 3, f"{block.where()}: bad table row {line!r}"
                rows.append((cells[0], cells[1], cells[2]))
            runs.append(Documented(block.where(), shlex.split(lines[0])[2:], rows))
    return runs


DOCUMENTED = _documented_runs()


def test_docs_document_enough_results() -> None:
    assert len(DOCUMENTED) >= 17
    assert all(run.rows for run in DOCUMENTED)


@pytest.mark.parametrize("run", DOCUMENTED, ids=lambda r: r.where)
def test_documented_result_is_what_the_simulator_prints(run: Documented) -> None:
    result = _simulate_json([a if a.startswith("-") else str(ROOT / a) for a in run.args])
    actual: list[tuple[str, str, str]] = [
        (
            p["pod"].removeprefix("default/"),
            p["node"],
            ", ".join(d["device"] for d in p["devices"]),
        )
        for p in result["placements"]
    ]
    reasons = {
        u["pod"].removeprefix("default/"): u["reason"]
        for u in [*result["unschedulable"], *result["skipped"]]
    }
    expected_placed = [row for row in run.rows if row[1] != "—"]
    assert actual == expected_placed, run.where
    expected_failed = {pod: fragment for pod, node, fragment in run.rows if node == "—"}
    assert set(reasons) == set(expected_failed), run.where
    for pod, fragment in expected_failed.items():
        assert fragment in reasons[pod], (run.where, reasons[pod])


def _other_simulate_lines() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for doc in DOCS:
        for block in _blocks(doc):
            if block.lang != "sh":
                continue
            found.extend(
                (block.where(), shlex.split(line, comments=True)[2:])
                for line in block.text.splitlines()
                if line.startswith(".venv/bin/biaxial simulate ")
            )
    return found


@pytest.mark.parametrize(
    ("where", "args"), _other_simulate_lines(), ids=[w for w, _ in _other_simulate_lines()]
)
def test_quickstart_simulate_commands_run(where: str, args: list[str], tmp_path: Path) -> None:
    resolved: list[str] = []
    wants_plot = False
    for arg in args:
        if wants_plot:
            resolved.append(str(tmp_path / arg))
            wants_plot = False
            continue
        wants_plot = arg == "--plot"
        resolved.append(str(ROOT / arg) if (ROOT / arg).exists() else arg)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = biaxial_main(["simulate", *resolved])
    assert code == 0, where
    assert out.getvalue().strip(), where
    if "--plot" in args:
        plotted = tmp_path / args[args.index("--plot") + 1]
        assert plotted.stat().st_size > 0, where


def test_quickstart_explains_each_pod_its_directory_run_leaves_unplaced() -> None:
    # Before: "simulate examples/requesting-gpus/" left 5 of 15 pods unschedulable, trainer
    # among them, without a word (requesting-gpus.md shows trainer placed when run alone).
    quickstart = ROOT / "docs" / "quickstart.md"
    runs = [r for r in DOCUMENTED if r.where.startswith("docs/quickstart.md:")]
    directory = [r for r in runs if any((ROOT / a).is_dir() for a in r.args)]
    assert directory, "quickstart.md documents the run of a directory"
    text = quickstart.read_text(encoding="utf-8")
    for run in directory:
        unplaced = {re.sub(r"-[0-9]+$", "", pod) for pod, node, _ in run.rows if node == "—"}
        assert unplaced
        assert [pod for pod in sorted(unplaced) if f"`{pod}`" not in text] == []
