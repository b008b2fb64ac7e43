"""The toolkit every report of the experiments draws on (the run's, capacity's, the model's,
compare's): the paper's reference values, a colour per topology and engine, how numbers are
written, figures saved as PNG and SVG, and a report's blocks rendered as Markdown and as one
self-contained HTML page.

A report is a list of blocks: ("h1" | "h2" | "h3", text), ("p", text), ("list", [text]),
("table", DataFrame), ("figure", png path, caption).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import matplotlib
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.analysis import stats  # noqa: E402
from experiments.design.matrix import BASELINE, COMPILED_ENGINE, ENFORCING, ENGINES, PAPER_NAMES, TOPOLOGIES, case_name  # noqa: E402


PAPER_REFERENCE = Path(__file__).resolve().parents[1] / "paper_reference.json"

# A colour per topology in the experiments' order, from Okabe and Ito's palette (told apart with
# every common colour-vision deficiency): vermillion, blue, bluish green, reddish purple (not the
# orange next to vermillion: the palette's closest pair), then orange, sky blue, yellow; the
# reference grey. A topology added to the manifests takes the next one.
PALETTE = ("#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

COLORS = {**dict(zip(ENFORCING, PALETTE)), BASELINE: "#999999"}

# The compiled engine's boxes and bars: its topology's colour this much lighter and striped
# (ENGINE_HATCH; a dotted hatch made each SVG megabytes), drawn right after the same topology's
# envoy-opa ones, so each pair reads as one topology and the engine shows without colour too; in
# line plots, by marker and line style.
COMPILED_LIGHTER = 0.45
ENGINE_HATCH = {COMPILED_ENGINE: "//"}
ENGINE_MARKER = {COMPILED_ENGINE: "s", stats.NO_ENGINE: "D"}  # envoy-opa: "o"
ENGINE_LINE = {COMPILED_ENGINE: "--", stats.NO_ENGINE: ":"}  # envoy-opa: "-"

SATURATED_MARK = "†"


def load_paper_reference() -> dict:
    return json.loads(PAPER_REFERENCE.read_text())


# ---- formatting --------------------------------------------------------------------------

def ms(value) -> str:
    return "–" if pd.isna(value) else f"{value:.3f}"


def rate_text(value) -> str:
    return "–" if pd.isna(value) else f"{value:.1f}"


def percent(value) -> str:
    return "–" if pd.isna(value) else f"{value:.1%}"


def cores(value) -> str:
    return "–" if pd.isna(value) else f"{round(value, 2) + 0.0:.2f}"  # + 0.0: no "-0.00" from sampling noise


def ratio_text(value) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}×"


def marked(text, saturated: bool) -> str:
    """A value with the saturated mark when its case is saturated."""
    return f"{text} {SATURATED_MARK}" if saturated else f"{text}"


def arch(topology: str) -> str:
    return PAPER_NAMES.get(topology, topology)


def names(frame: pd.DataFrame) -> list[str]:
    """Each row's topology under its engine, as an architect reads it: "CE (envoy-opa)", "CE (compiled)", "baseline"."""
    return [case_name(topology, engine) for topology, engine in zip(frame["topology"], frame["engine"])]


# ---- figures -----------------------------------------------------------------------------

def save(figure, figures_dir: Path, name: str, load: str | None = None) -> Path:
    """Write a figure as PNG and SVG; one measured under load names that load in its corner."""
    if load:
        figure.text(0.995, 0.998, f"load: {load}", ha="right", va="top", fontsize=7, color="#444")
    png = figures_dir / f"{name}.png"
    figure.savefig(png, dpi=130, bbox_inches="tight")
    figure.savefig(figures_dir / f"{name}.svg", bbox_inches="tight")
    plt.close(figure)
    return png


def color(topology: str, engine: str) -> tuple:
    """The topology's colour; lighter under the compiled engine."""
    base = np.array(to_rgb(COLORS[topology]))
    return tuple(base + (1 - base) * COMPILED_LIGHTER) if engine == COMPILED_ENGINE else tuple(base)


def series_of(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The (topology, engine) pairs a frame holds, in the report's order: a topology's engines side by side."""
    present = set(zip(frame["topology"], frame["engine"]))
    return [(t, e) for t in TOPOLOGIES for e in [*ENGINES, stats.NO_ENGINE] if (t, e) in present]


def hatch(engine: str) -> str:
    return ENGINE_HATCH.get(engine, "")


def marker(engine: str) -> str:
    return ENGINE_MARKER.get(engine, "o")


def line_style(engine: str) -> str:
    return ENGINE_LINE.get(engine, "-")


def series_legend(pairs: list[tuple[str, str]], extra: list | None = None) -> list:
    return [Patch(facecolor=color(t, e), edgecolor="black", hatch=hatch(e), label=case_name(t, e)) for t, e in pairs] + (extra or [])


def line_legend(pairs: list[tuple[str, str]], extra: list | None = None) -> list:
    """Legend entries of line plots: the topology's colour, the engine's marker and line style."""
    return [Line2D([], [], color=COLORS[t], marker=marker(e), linestyle=line_style(e), label=case_name(t, e)) for t, e in pairs] + (extra or [])


# Saturation as a mark above a box or bar, not a hatch, which a thin box hides; and a heavy red
# outline around the box itself.
SATURATED_EDGE = {"edgecolor": "#B00000", "linewidth": 2.2}
SATURATED_PATCH = Patch(facecolor="white", label=f"{SATURATED_MARK} saturated (red outline)", **SATURATED_EDGE)


def mark_saturated(ax, x: float, top: float | None = None) -> None:
    """The saturated mark above a bar whose top is at `top` (data coordinates), or, for a box
    (whose outliers may reach anywhere above it), along the panel's top edge."""
    where = {"xy": (x, top)} if top is not None else {"xy": (x, 1.0), "xycoords": ("data", "axes fraction")}
    ax.annotate(SATURATED_MARK, **where, xytext=(0, 2 if top is not None else -2), textcoords="offset points", ha="center",
                va="bottom" if top is not None else "top", fontsize=10, fontweight="bold", color="#B00000")


def panels(count: int, width: float, height: float, columns: int = 2, **options):
    """A grid of `count` panels, at most `columns` wide, so that a page shows them legibly."""
    columns = min(columns, count)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, **options)
    flat = list(axes.flatten())
    for unused in flat[count:]:
        unused.set_visible(False)
    return figure, flat[:count]


def log_scale(ax) -> None:
    """A log y axis labelled 2, 5, 10, 20, ... rather than 2 x 10^0."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}" if str(f"{value:g}")[0] in "25" else ""))


LEGEND_COLUMNS = 5  # entries per legend row: a topology's two engines and the baseline fit twice


def legend_below(figure, handles: list) -> None:
    """One legend under all panels, where it hides no bar or box."""
    rows = -(-len(handles) // LEGEND_COLUMNS)
    figure.tight_layout(rect=(0, 0.04 + 0.04 * rows, 1, 1))
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), LEGEND_COLUMNS), fontsize=8, frameon=False)


def grouped_bars(ax, groups: list, series: dict) -> None:
    """Bars of every (topology, engine) side by side in each group; series: that pair -> one value per group."""
    width = 0.8 / max(1, len(series))
    for index, ((topology, engine), heights) in enumerate(series.items()):
        positions = np.arange(len(groups)) + (index - (len(series) - 1) / 2) * width
        ax.bar(positions, heights, width * 0.95, color=color(topology, engine), edgecolor="black", linewidth=0.5, hatch=hatch(engine))
    ax.set_xticks(range(len(groups)), groups)


# ---- documents ---------------------------------------------------------------------------

def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub table by pandas' to_markdown (tabulate); a cell's | escaped, which tabulate leaves as is."""
    escaped = frame.map(lambda value: str(value).replace("|", "\\|"))
    return escaped.to_markdown(index=False, tablefmt="github", disable_numparse=True)


def inline_html(text: str) -> Markup:
    """Escape, then `code` and **bold**: the only markup the report's prose uses."""
    escaped = str(escape(text))
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return Markup(re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped))


def plain(text: str) -> str:
    """A block's text without its markup: a heading's anchor, a figure's alt text."""
    return text.replace("`", "").replace("**", "")


def anchor(text: str, taken: set[str]) -> str:
    """A heading's id: its words, lower case, joined by hyphens; unique in the page."""
    base = re.sub(r"[^a-z0-9]+", "-", plain(text).lower()).strip("-") or "section"
    name, number = base, 2
    while name in taken:
        name, number = f"{base}-{number}", number + 1
    taken.add(name)
    return name


def figure_parts(content: list) -> tuple[Path, str, str]:
    """(png, caption, alt) of a figure block; a block without its own alt text is described by its caption."""
    path, caption, *alt = content
    return path, caption, plain(alt[0] if alt else caption)


def render_markdown(blocks: list[tuple], report_dir: Path) -> str:
    out = []
    for kind, *content in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"{'#' * int(kind[1])} {content[0]}")
        elif kind == "p":
            out.append(content[0])
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "table":
            out.append(markdown_table(content[0]))
        elif kind == "figure":
            path, caption, alt = figure_parts(content)
            out.append(f"![{alt}]({path.relative_to(report_dir).as_posix()})\n\n*{caption}* (also as [SVG]({path.with_suffix('.svg').relative_to(report_dir).as_posix()}))")
    return "\n\n".join(out) + "\n"


TEMPLATES = Environment(loader=PackageLoader("experiments.report", "templates"), autoescape=select_autoescape(["html", "j2"]),
                        trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined)


def page_blocks(blocks: list[tuple]) -> tuple[list[dict], list[dict]]:
    """The blocks as the template takes them, and the table of contents (every h2, its h3s under it)."""
    taken: set[str] = set()
    items, contents = [], []
    for kind, *content in blocks:
        if kind in ("h1", "h2", "h3"):
            item = {"kind": "heading", "level": int(kind[1]), "id": anchor(content[0], taken), "html": inline_html(content[0])}
            if kind == "h2":
                contents.append({**item, "children": []})
            elif kind == "h3" and contents:
                contents[-1]["children"].append(item)
        elif kind == "p":
            item = {"kind": "p", "html": inline_html(content[0])}
        elif kind == "list":
            item = {"kind": "list", "items": [inline_html(text) for text in content[0]]}
        elif kind == "table":
            item = {"kind": "table", "html": Markup(content[0].to_html(index=False, escape=True, border=0))}
        elif kind == "figure":
            path, caption, alt = figure_parts(content)
            item = {"kind": "figure", "src": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode(), "alt": alt,
                    "caption": inline_html(caption)}
        else:
            raise ValueError(f"unknown block kind {kind!r}")
        items.append(item)
    return items, contents


def render_html(blocks: list[tuple], title: str) -> str:
    """One self-contained page (figures embedded) from templates/report.html.j2: a table of contents
    after the title, each wide table scrolling in a box of its own."""
    items, contents = page_blocks(blocks)
    return TEMPLATES.get_template("report.html.j2").render(title=title, blocks=items, contents=contents)
