"""make test and make test-scale between them run every test but the Kubernetes ones exactly once:
each pytest stream of their recipes (make/test.mk: its folders, --ignore and -m) selects from what
pytest collects under tests/unit/, tests/integration/ and tests/e2e/, and no test is in two streams
or in none. A marker expression that left a test out of every stream would drop it silently."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from _pytest.mark.expression import Expression

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "make" / "test.mk"
E2E = "tests/e2e"
FOLDERS = ("tests/unit", "tests/integration", E2E)  # all but tests/k8s/ (make k8s-e2e)

# Writes every collected test's node id and the names of its markers (a plugin of the collection below).
COLLECTOR = '''
import json, os

def pytest_collection_finish(session):
    with open(os.environ["COLLECTED"], "w") as out:
        json.dump({item.nodeid: sorted({mark.name for mark in item.iter_markers()}) for item in session.items}, out)
'''


def make_variables(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_0-9]+) := (.*)$", text, flags=re.MULTILINE))


def streams(target: str) -> list[tuple[list[str], list[str], str]]:
    """(folders, ignored folders, marker expression) of every pytest run in the recipe of `target`,
    its make variables expanded."""
    text = RECIPES.read_text()
    variables = make_variables(text)
    start = text.index(f"\n{target}: ")
    end = text.find("\n\n", start)
    recipe = text[start:end]
    for name, value in variables.items():
        recipe = recipe.replace(f"$({name})", value)
    found = []
    for command in re.findall(r"\$\(PY\) -m pytest (.*?) -p no:cacheprovider", recipe):
        words = shlex.split(command)
        folders = [word for word in words if word.startswith(FOLDERS)]
        if not folders:
            continue
        ignored = [word.removeprefix("--ignore=") for word in words if word.startswith("--ignore=")]
        expression = words[words.index("-m") + 1] if "-m" in words else ""
        found.append((folders, ignored, expression))
    return found


def collected(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "collector.py").write_text(COLLECTOR)
    out = tmp_path / "collected.json"
    done = subprocess.run([sys.executable, "-m", "pytest", *FOLDERS, "--collect-only", "-q", "-p", "collector", "-p", "no:cacheprovider",
                           "-m", ""], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{REPO}", "COLLECTED": str(out)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def selects(stream: tuple[list[str], list[str], str], nodeid: str, markers: list[str]) -> bool:
    folders, ignored, expression = stream
    path = nodeid.split("::")[0]

    def under(tops: list[str]) -> bool:
        return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)
    if not under(folders) or under(ignored):
        return False
    return not expression or Expression.compile(expression).evaluate(lambda name, **_: name in markers)


def placements(tests: dict[str, list[str]]) -> dict[str, list[tuple[str, int]]]:
    """{test: [(target, stream index)] of every stream that selects it}."""
    runs = {target: streams(target) for target in ("test-streams", "test-scale-streams")}
    assert len(runs["test-streams"]) == 5 and len(runs["test-scale-streams"]) == 3, runs
    return {nodeid: [(target, index) for target, found in runs.items() for index, stream in enumerate(found)
                     if selects(stream, nodeid, markers)]
            for nodeid, markers in tests.items()}


def test_every_test_runs_in_exactly_one_stream_of_make_test_or_make_test_scale_allowed(tmp_path):
    tests = collected(tmp_path)
    assert len(tests) > 1500
    where = placements(tests)
    assert {nodeid: places for nodeid, places in where.items() if len(places) != 1} == {}
    # The tests at scale are make test-scale's, the others make test's.
    assert {nodeid for nodeid, places in where.items() if places[0][0] == "test-scale-streams"} == \
        {nodeid for nodeid, markers in tests.items() if "scale" in markers} != set()


def test_a_test_in_two_streams_or_in_none_is_found_denied():
    # Twins of a real test: pooled and on a network of its own at once (two streams take it), and
    # one under no folder a stream runs (none does).
    where = placements({f"{E2E}/test_enforcement_e2e.py::test_both": ["e2e", "own_network", "pool"],
                        "tests/elsewhere/test_it.py::test_none": ["e2e"],
                        f"{E2E}/test_enforcement_e2e.py::test_once": ["e2e", "pool"]})
    assert [len(where[name]) for name in where] == [2, 0, 1]
