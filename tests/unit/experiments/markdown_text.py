"""Reading a report's Markdown as a reader of its rows does: pandas' to_markdown (tabulate) pads
every cell to its column's width, which the tests' expected rows do not spell out."""

import re


def compact(markdown: str) -> str:
    """The text with every run of spaces as one space, so a padded table row reads `| a | b |`."""
    return re.sub(r" {2,}", " ", markdown)
