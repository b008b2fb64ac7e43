"""One spelling per command in the docs: the control plane is `python -m complyroute ...` and the
experiments `python -m experiments ...` (README.md says once that `python` is `.venv/bin/python`),
not `.venv/bin/complyroute`, `complyroute experiments` or `python -m complyroute experiments`.
Findings records and generated pages keep what they were written with."""

import re

from tests.unit.test_docs_links import REPO, pages

OTHER_SPELLINGS = re.compile(r"\.venv/bin/complyroute|(?<![\w/.-])complyroute experiments|python -m complyroute experiments"
                             r"|\.venv/bin/python -m (complyroute|experiments)")
# Where the other spellings are named, or a record of a run keeps what it ran.
KEPT = ("README.md", "experiments/findings/", "experiments/sample/")


def other_spellings(text: str) -> list[str]:
    return [match.group(0) for match in OTHER_SPELLINGS.finditer(text)]


def test_the_docs_spell_each_command_one_way_allowed():
    found = {str(page.relative_to(REPO)): other_spellings(page.read_text()) for page in pages()
             if not str(page.relative_to(REPO)).startswith(KEPT)}
    assert {page: spellings for page, spellings in found.items() if spellings} == {}


def test_another_spelling_is_found_denied():
    assert other_spellings("run `.venv/bin/complyroute deploy` or `complyroute experiments run`, then .venv/bin/python -m experiments bench") == [
        ".venv/bin/complyroute", "complyroute experiments", ".venv/bin/python -m experiments"]
    assert other_spellings("python -m complyroute deploy; python -m experiments run") == []
