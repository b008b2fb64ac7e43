"""Every relative link in the repository's Markdown resolves: the file or folder it names exists,
and an anchor it names is a heading of that page (GitHub's slugs). The docs are split by reader
and sections move between pages; a moved section must take its links along.

The pages are the Markdown files git tracks (generated ones, under build/ or runs/, are not).
Links are `[text](target)` outside fenced code blocks and code spans; a target with a scheme
(https:, mailto:) is not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def pages(repo: Path = REPO) -> list[Path]:
    """The Markdown files git tracks in `repo`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=repo, capture_output=True, check=True)
    return [repo / name for name in listed.stdout.decode().split("\0") if name]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that names no file, or a heading its page does not have."""
    broken = []
    for number, line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: {resolved.name} has no heading #{anchor}")
    return broken


def test_every_relative_link_in_the_docs_resolves_allowed():
    checked = pages()
    assert any(page.name == "README.md" and page.parent == REPO for page in checked)
    assert [line for page in checked for line in broken_links(page)] == []


def test_a_link_to_a_missing_file_is_caught_denied(tmp_path):
    (tmp_path / "there.md").write_text("# There\n\n## A section: `with code`\n")
    page = tmp_path / "page.md"
    page.write_text("[fine](there.md#a-section-with-code) and [gone](not-there.md)\n"
                    "```\n[in a code block](not-checked.md)\n```\n")
    assert broken_links(page) == [f"{page}:1: not-there.md: no such file"]


def test_a_link_to_a_missing_heading_is_caught_denied(tmp_path):
    (tmp_path / "there.md").write_text("# There\n\n## Moved away\n")
    page = tmp_path / "page.md"
    page.write_text("See [it](there.md#moved-away), [here](#a-heading) and [gone](there.md#moved).\n\n# A heading\n")
    assert broken_links(page) == [f"{page}:1: there.md#moved: there.md has no heading #moved"]


def test_headings_repeated_and_in_code_blocks_get_github_s_anchors_allowed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Runs\n\n## Runs\n\n```\n# not a heading\n```\n\n## On Kubernetes: `--target k8s`\n")
    assert anchors(page) == {"runs", "runs-1", "on-kubernetes---target-k8s"}
