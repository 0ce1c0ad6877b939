"""STAND-IN until markup.py is merged from main: plain text escaped as HTML, split at the limit."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class MatrixText:
    body: str
    formatted_body: str


def utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def matrix_parts(markdown: str, limit: int = 32000) -> list[MatrixText]:
    parts = [markdown[start : start + limit] for start in range(0, max(len(markdown), 1), limit)]
    return [MatrixText(part, html.escape(part).replace("\n", "<br>")) for part in parts]
