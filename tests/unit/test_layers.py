"""The layers are a contract: no module of complyroute/ or experiments/ imports itself back
through others (no circles), the control plane (complyroute/) never imports the experiments,
which stand on it, and inside complyroute/, as inside experiments/, a layer never imports one
above it.

The layers of complyroute/, lowest first (LAYERS); a module may import its own layer and any
below it:

1. files: a file that running processes read, written whole (write_whole);
2. topology: the manifest, the plan a placement makes (points, listeners, endpoints), and how
   a socket is reached (localhttp);
3. trust: the CA, identities, mutual TLS peers and label tokens, read off the plan;
4. policy: the rule set's files, label schema, data, bundles and bundle server;
5. proxy: Envoy's and OPA's configuration of one point, from the plan, its trust and the labels;
6. engines: how the points decide (envoy-opa, envoy-compiled, the precomputed space);
7. runtime: running a plan, behind one Target interface (target.py, targets.py), on this
   machine (local/) and on Kubernetes (kubernetes/);
8. evidence: what a run proves afterwards (audit, trace), read from the run a runtime wrote;
9. authoring: for whoever writes rule sets (policy-diff, policy-bench);
10. the commands: client.py and __main__.py.

The two runtimes stand side by side on one floor: runtime/kubernetes/ imports nothing of
runtime/local/ and runtime/local/ nothing of runtime/kubernetes/ (APART); what both need is in
runtime/ itself (target.py).

Evidence stands above runtime, not below: trace.py finds a run, its state and its labels
through runtime/local/ (deployment.py, rendering.py), and nothing in a runtime reads the evidence.

The layers of experiments/, lowest first (EXPERIMENT_LAYERS), the same way:

1. load: the load a cell receives (the records and their expected answers, the open loop's
   schedule, a round trip's time split, the Locust users);
2. design: what a run measures and where (the matrix, capacity's search and held criteria,
   changeability's change, the targets): a matrix names its mixes and arrivals;
3. analysis: what a run's raw data says (statistics, the testbed model and its predictions);
4. report: every report, built from a run folder alone;
5. run: everything that deploys and loads into a run folder (the runner, capacity's steps, the
   soak, the reload, the bench), which writes a run's report when it ends;
6. the command line: __main__.py.

A layer's part names a module, or a package and every module in it; a top-level package's own
name (complyroute, experiments) stands for its empty __init__ alone, so that a module added at
its top belongs to no layer until a layer names it.

Read from the source with `ast`, not by importing: every import counts, also one inside a
function (a lazy import closes a circle as surely as one at the top) and one under
`if TYPE_CHECKING`. `from package import name` is an edge to `package.name` when that is a
module, else to the package; importing a submodule is not counted as importing its parent
package's `__init__` too (Python runs it, but counting it would make every package whose
`__init__` imports a submodule a circle).

And no module of complyroute/, experiments/ or services/ is over 400 lines unless its docstring
(a JavaScript file's opening comment) says why, in a paragraph that starts "Over 400 lines": a
longer module is one idea that reads best whole, or it is split.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("complyroute", "experiments")
GROUND = "complyroute"  # imports nothing of these above it
ABOVE = ("experiments",)
# Circles not broken yet, each with what keeps it (issue 26). A listed circle that is gone fails
# the test too, so that the list only ever shrinks. None is left.
KNOWN_CYCLES: list[list[str]] = []
# complyroute/'s layers, lowest first: a package (and everything in it) or a module each.
LAYERS = [
    ["complyroute"],  # the package itself: empty
    ["complyroute.files"],
    ["complyroute.topology"],
    ["complyroute.trust"],
    ["complyroute.policy"],
    ["complyroute.proxy"],
    ["complyroute.engines"],
    ["complyroute.runtime"],
    ["complyroute.evidence"],
    ["complyroute.authoring"],
    ["complyroute.client", "complyroute.__main__"],
]
# Packages of one layer that import nothing of each other, in either direction.
APART = [("complyroute.runtime.local", "complyroute.runtime.kubernetes")]
# experiments/'s layers, lowest first, as LAYERS.
EXPERIMENT_LAYERS = [
    ["experiments"],  # the package itself: empty
    ["experiments.load"],
    ["experiments.design"],
    ["experiments.analysis"],
    ["experiments.report"],
    ["experiments.run"],
    ["experiments.__main__"],
]
LONGEST = 400  # lines a module may have without saying why
REASON = "Over 400 lines"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages under root, by dotted name."""
    return {module_name(path, root): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known`, and the top-level packages, that the module `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                found.add(candidate if candidate in known else source)
    return found


def graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module's imports, as names of the modules it imports (any module, not only ours)."""
    found = modules(root, packages)
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module that imports
    itself (Tarjan's algorithm, iterative): each is at least one circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start] & edges.keys())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor] & edges.keys()))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges[node]:
                        found.append(sorted(component))
    return found


def upward(edges: dict[str, set[str]], ground: str = GROUND, above: tuple[str, ...] = ABOVE) -> list[str]:
    """`module -> import` for every import of a ground-floor module from a layer above it."""
    return sorted(f"{name} -> {target}" for name, targets in edges.items() if name.split(".")[0] == ground
                  for target in targets if target.split(".")[0] in above)


def holds(part: str, name: str) -> bool:
    """Whether a layer's part holds module `name`: the module it names, or a module of the package
    it names; a top-level package's name holds its __init__ alone."""
    return name == part or ("." in part and name.startswith(part + "."))


def layer_of(name: str, layers: list[list[str]] = LAYERS) -> int | None:
    """The index of the layer holding module `name` (the longest part that holds it)."""
    found = [(len(part), index) for index, parts in enumerate(layers) for part in parts if holds(part, name)]
    return max(found)[1] if found else None


def downward(edges: dict[str, set[str]], layers: list[list[str]] = LAYERS, ground: str = GROUND) -> list[str]:
    """`module -> import` for every import of a module of the package `ground` from a higher
    layer, and `module: no layer` for a module of it that no layer holds."""
    found = []
    for name, targets in edges.items():
        if name.split(".")[0] != ground:
            continue
        level = layer_of(name, layers)
        if level is None:
            found.append(f"{name}: no layer")
            continue
        for target in targets:
            above = layer_of(target, layers) if target.split(".")[0] == ground else None
            if above is not None and above > level:
                found.append(f"{name} -> {target}")
    return sorted(found)


def crossing(edges: dict[str, set[str]], apart: list[tuple[str, str]] = APART) -> list[str]:
    """`module -> import` for every import of a module of one package of a pair in `apart` from
    the other package of the pair."""
    pairs = [*apart, *((second, first) for first, second in apart)]
    return sorted(f"{name} -> {target}" for name, targets in edges.items() for target in targets
                  for first, second in pairs if holds(first, name) and holds(second, target))


def sources(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The modules of the packages, and the services' own JavaScript (not their node_modules)."""
    python = [path for package in packages for path in sorted((root / package).rglob("*.py"))]
    javascript = sorted(path for path in (root / "services").rglob("*.js") if "node_modules" not in path.relative_to(root).parts)
    return python + javascript


def opening(path: Path) -> str:
    """A module's docstring; a JavaScript file's opening comment."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text, str(path))) or ""
    return "\n".join(itertools.takewhile(lambda line: line.startswith("//"), text.splitlines()))


def long_without_reason(paths: list[Path], root: Path = REPO) -> list[str]:
    """`path: N lines` for every module over LONGEST lines whose opening does not say why."""
    found = []
    for path in paths:
        count = len(path.read_text().splitlines())
        if count > LONGEST and REASON not in opening(path):
            found.append(f"{path.relative_to(root)}: {count} lines")
    return found


def test_no_import_cycles():
    assert sorted(cycles(graph())) == sorted(KNOWN_CYCLES)


def test_the_control_plane_never_imports_the_experiments():
    assert upward(graph()) == []


def test_no_layer_imports_a_higher_one():
    assert downward(graph()) == []


def test_the_runtimes_import_nothing_of_each_other():
    assert crossing(graph()) == []


def test_no_layer_of_the_experiments_imports_a_higher_one():
    assert downward(graph(), EXPERIMENT_LAYERS, "experiments") == []


def test_the_graph_sees_every_kind_of_import():
    edges = graph()
    assert "experiments" not in edges["complyroute.topology.manifest"]
    assert "complyroute.topology.manifest" in edges["experiments.design.matrix"]  # from complyroute.topology import manifest
    assert "experiments.design.matrix" in edges["experiments.run.runner"]  # from experiments.design.matrix import BENCH_CSV, ...
    assert "experiments.design.matrix" in edges["experiments.run.capacity_run"]  # from experiments.design import matrix
    assert "experiments.run.bench" in edges["experiments.run.runner"]  # inside Runner.measure_bench


def test_no_module_over_400_lines_without_its_reason():
    assert long_without_reason(sources()) == []


def test_a_long_module_without_its_reason_is_found(tmp_path):
    """The size check can fail: over 400 lines without the reason, denied; with it, or at 400, allowed."""
    (tmp_path / "low").mkdir()
    (tmp_path / "services" / "src").mkdir(parents=True)
    (tmp_path / "services" / "node_modules").mkdir()
    body = "x = 1\n" * LONGEST
    (tmp_path / "low" / "long.py").write_text('"""One idea."""\n' + body)
    (tmp_path / "low" / "reasoned.py").write_text(f'"""One idea.\n\n{REASON}: it reads best whole."""\n' + body)
    (tmp_path / "low" / "exactly.py").write_text(body)
    (tmp_path / "services" / "src" / "long.js").write_text("// One concern.\n" + "x()\n" * LONGEST)
    (tmp_path / "services" / "src" / "reasoned.js").write_text(f"// One concern.\n//\n// {REASON}: it reads best whole.\n" + "x()\n" * LONGEST)
    (tmp_path / "services" / "node_modules" / "vendored.js").write_text("x()\n" * (LONGEST + 1))
    assert long_without_reason(sources(tmp_path, ("low",)), tmp_path) == ["low/long.py: 401 lines", "services/src/long.js: 401 lines"]


def test_a_circle_is_found(tmp_path):
    """The checks can fail: a package of three modules in a circle (one import lazy, one relative)
    and a ground floor that reaches up."""
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "low" / "a.py").write_text("from . import b\n")
    (tmp_path / "low" / "b.py").write_text("from low.c import thing\n")
    (tmp_path / "low" / "c.py").write_text("def thing():\n    from .a import x\n")
    (tmp_path / "low" / "d.py").write_text("import high.top\n")
    (tmp_path / "low" / "e.py").write_text("from .e import y\n")
    (tmp_path / "high" / "__init__.py").write_text("")
    (tmp_path / "high" / "top.py").write_text("from low import a\n")
    edges = graph(tmp_path, ("low", "high"))
    assert cycles(edges) == [["low.a", "low.b", "low.c"], ["low.e"]]
    assert upward(edges, "low", ("high",)) == ["low.d -> high.top"]
    (tmp_path / "low" / "c.py").write_text("def thing():\n    pass\n")
    (tmp_path / "low" / "e.py").write_text("")
    assert cycles(graph(tmp_path, ("low", "high"))) == []
    # A lower layer that imports a higher one, and a module no layer names.
    layers = [["low.a", "low.b"], ["low.c", "low.e"]]
    (tmp_path / "low" / "b.py").write_text("from low.c import thing\n")
    assert downward(graph(tmp_path, ("low", "high")), layers, "low") == ["low.b -> low.c", "low.d: no layer", "low: no layer"]


def test_an_import_between_packages_kept_apart_is_found(tmp_path):
    """The runtimes' check can fail: a module of one package that imports the other (lazily, or
    by its package's name), denied either way, beside an import of the floor they share, allowed."""
    for sub in ("one", "two"):
        (tmp_path / "floor" / sub).mkdir(parents=True)
        (tmp_path / "floor" / sub / "__init__.py").write_text("")
    (tmp_path / "floor" / "__init__.py").write_text("")
    (tmp_path / "floor" / "shared.py").write_text("")
    (tmp_path / "floor" / "one" / "a.py").write_text("from floor import shared\n")
    (tmp_path / "floor" / "two" / "b.py").write_text("from floor.shared import thing\n")
    apart = [("floor.one", "floor.two")]
    assert crossing(graph(tmp_path, ("floor",)), apart) == []
    (tmp_path / "floor" / "one" / "a.py").write_text("def later():\n    from floor.two import b\n")
    (tmp_path / "floor" / "two" / "b.py").write_text("import floor.one\n")
    assert crossing(graph(tmp_path, ("floor",)), apart) == ["floor.one.a -> floor.two.b", "floor.two.b -> floor.one"]


def test_an_upward_import_between_subpackages_is_found(tmp_path):
    """The experiments' check can fail: a module of a lower subpackage that imports one of a
    higher (lazily, or the command line), denied, beside its twins that import downward and
    within their own layer, allowed; and a module at the package's top, in no layer."""
    package = tmp_path / "exp"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("from exp.high import top\n")
    (package / "low" / "base.py").write_text("import json\n")
    (package / "low" / "sibling.py").write_text("from exp.low import base\n")
    (package / "high" / "top.py").write_text("from exp.low.base import loads\n")
    layers = [["exp"], ["exp.low"], ["exp.high"], ["exp.__main__"]]
    assert downward(graph(tmp_path, ("exp",)), layers, "exp") == []
    (package / "low" / "reaching.py").write_text("def later():\n    from exp.high import top\n")
    (package / "low" / "commanding.py").write_text("import exp.__main__\n")
    (package / "loose.py").write_text("")
    assert downward(graph(tmp_path, ("exp",)), layers, "exp") == [
        "exp.loose: no layer", "exp.low.commanding -> exp.__main__", "exp.low.reaching -> exp.high.top"]
