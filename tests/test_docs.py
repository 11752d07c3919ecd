"""The documentation builds and says only what holds.

- `mkdocs build --strict` (mkdocs.yml: every link, anchor and page in the nav checked, offline)
  passes; skipped only where mkdocs is not installed (it comes with the `test` extra).
- The user docs (README.md, CHANGELOG.md, docs/*.md) name no commit of this repository, no
  "issue N" and no "this session", and every repository path they mention exists.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _user_docs() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if (ROOT / "CHANGELOG.md").exists():
        docs.append(ROOT / "CHANGELOG.md")
    return docs


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _lines(path: Path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        yield number, line


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[test]' brings mkdocs-material)")
def test_the_site_builds_strict_and_offline(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + proc.stdout[-4000:] + proc.stderr[-8000:]
    assert (tmp_path / "site" / "index.html").exists()


# --- what a reader should never meet ---------------------------------------------------------

_PHRASES = re.compile(r"\bissues? #?\d+|\bthis session\b|\bthe commit before\b|\bcommit [0-9a-f]{7,40}\b", re.I)
_HEX = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")


def _commits(words: set[str]) -> set[str]:
    """The words that name a commit of this repository (none outside a git checkout)."""
    if not words or shutil.which("git") is None or not (ROOT / ".git").exists():
        return set()
    ordered = sorted(words)
    proc = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=ROOT, capture_output=True,
                          text=True, input="".join(f"{word}^{{commit}}\n" for word in ordered), timeout=60)
    if proc.returncode != 0:
        return set()
    answers = proc.stdout.splitlines()
    return {word for word, answer in zip(ordered, answers) if answer == "commit"}


def test_user_docs_name_no_commit_issue_or_session():
    found, hex_words = [], {}
    for doc in _user_docs():
        for number, line in _lines(doc):
            for match in _PHRASES.finditer(line):
                found.append(f"{_rel(doc)}:{number}: {match.group(0)!r}")
            for match in _HEX.finditer(line):
                if re.search(r"\d", match.group(0)) and re.search(r"[a-f]", match.group(0)):
                    hex_words.setdefault(match.group(0), []).append(f"{_rel(doc)}:{number}")
    for word in sorted(_commits(set(hex_words))):
        found += [f"{where}: commit {word}" for where in hex_words[word]]
    assert not found, "the docs are for users: no commits, issue numbers or sessions:\n" + "\n".join(found)


# --- the README's links into the docs land on a heading (mkdocs checks the docs' own) ---------

def _slug(heading: str) -> str:
    """Python-Markdown's toc slug of a heading, as mkdocs makes its anchors."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", heading)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def test_the_readmes_links_into_the_docs_land():
    found = []
    for number, line in _lines(ROOT / "README.md"):
        for target, anchor in re.findall(r"\]\((docs/[^)#\s]*)(?:#([^)\s]*))?\)", line):
            page = ROOT / target
            if not page.is_file():
                found.append(f"README.md:{number}: {target} is not a file")
            elif anchor and anchor not in {_slug(h) for h in re.findall(r"(?m)^#+\s+(.*?)\s*$", page.read_text())}:
                found.append(f"README.md:{number}: {target} has no heading #{anchor}")
    assert not found, "\n".join(found)


# --- every path named exists -----------------------------------------------------------------

_ROOT_FILES = ("README.md", "CHANGELOG.md", "config.yaml", "pyproject.toml", "mkdocs.yml")
_PLACEHOLDER = re.compile(r"[<>{}*?\[\]…]|\.\.\.|\bNAME\b|\bN\b")


def _path_pattern() -> re.Pattern:
    roots = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
                   and p.name not in ("site", "build", "dist") and not p.name.endswith(".egg-info"))
    roots += [".ci"] if (ROOT / ".ci").is_dir() else []
    names = "|".join(re.escape(name + "/") for name in roots) + "|" + "|".join(re.escape(f) for f in _ROOT_FILES)
    # A path starts a word (or follows ./ or ../, a link's parenthesis or a backtick), never inside another
    # path: /opt/edge-inferd/models/x is not models/x.
    return re.compile(r"(?:(?<=[\s`(\[\"'=])|^)(?:\.\.?/)*((?:" + names + r")(?:[^\s`)\"',;\]]|\](?!\())*)")


def _named(line: str, match: re.Match) -> bool:
    """A mention in backticks or a link is a path; in prose only one that looks like a file or folder (daemon/echo
    may be a ratio)."""
    if line[:match.start()].count("`") % 2 or line[max(0, match.start() - 2):match.start()] == "](":
        return True
    return bool(re.search(r"\.\w+$|/$", match.group(1).rstrip(".:")))


def _missing(mention: str) -> bool:
    path = mention.split("::")[0].split("#")[0]
    path = re.sub(r":\d+(-\d+)?$", "", path).rstrip(".:!")
    placeholder = _PLACEHOLDER.search(path)
    if placeholder:  # models/<name>/, tests/integration/test_*.py: the part before it must exist
        path = path[:placeholder.start()].rsplit("/", 1)[0]
    return not (ROOT / path).exists()


def test_every_path_the_user_docs_name_exists():
    pattern, found = _path_pattern(), []
    for doc in _user_docs():
        for number, line in _lines(doc):
            for match in pattern.finditer(line):
                if _named(line, match) and _missing(match.group(1)):
                    found.append(f"{_rel(doc)}:{number}: {match.group(1)}")
    assert not found, "the docs name paths that are not in the repository:\n" + "\n".join(found)
