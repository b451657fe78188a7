"""Cheap surface features of a prompt (numpy, microseconds): what the quality predictor reads beside the embedding.

Length (characters, words, lines), numbers and math, multiple-choice options, code, question words, script.
Every count is a C-level pass (regex, str.count, Counter; no Python loop per character).
The encoder sees only the head and tail of a long prompt; these count the whole text (up to SCAN_CHARS for the
pattern counts), which is where a prompt's size and kind show. Every value is a log count or a share, so
no single prompt dominates a fitted weight.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

SCAN_CHARS: Final = 4_096  # pattern counts read at most this much of a prompt (its head)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_OPTION = re.compile(r"[\s(]([A-J])[).:]\s")  # "A) ", "(B) ", "C. ", "D: " after a space, newline or "("
_MATH = re.compile(r"[=+*/^<>%$]")
_LATEX = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[a-z]+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_UPPER = re.compile(r"[A-Z]")
_CODE_MARKS: Final = ("```", "def ", "return", "import ", "class ", "function", ";\n", "{\n", "=>", "==", "print(")
_MATH_MARKS: Final = ("\\frac", "\\sqrt", "sqrt(", " mod ")
_QUESTION: Final = ("what", "which", "who", "whom", "whose", "when", "where", "why", "how")
_IMPERATIVE: Final = ("write", "explain", "describe", "create", "implement", "design", "compare", "prove", "solve",
                      "calculate")

NAMES: Final = (
    "log_chars", "log_words", "log_lines", "log_numbers", "digit_share", "log_options", "has_options",
    "log_code", "log_math", "log_latex", "log_questions", "question_mark_share", "log_imperatives",
    "non_ascii_share", "upper_share", "mean_word_length",
)
COUNT: Final = len(NAMES)
Array = npt.NDArray[np.float32]


def prompt_features(text: str) -> list[float]:
    """The COUNT values of NAMES for one prompt."""
    head = text[:SCAN_CHARS]
    chars = max(len(head), 1)
    words = head.split()
    numbers = _NUMBER.findall(head)
    options = set(_OPTION.findall(" " + head))
    vocabulary = Counter(_WORD.findall(head.lower()))
    return [
        math.log1p(len(text)),
        math.log1p(len(words)),
        math.log1p(text.count("\n")),
        math.log1p(len(numbers)),
        sum(map(len, numbers)) / chars,
        math.log1p(len(options)),
        1.0 if len(options) >= 3 else 0.0,
        math.log1p(sum(head.count(mark) for mark in _CODE_MARKS)),
        math.log1p(len(_MATH.findall(head)) + sum(head.count(mark) for mark in _MATH_MARKS)),
        math.log1p(len(_LATEX.findall(head))),
        math.log1p(sum(vocabulary[w] for w in _QUESTION)),
        head.count("?") / max(len(words), 1),
        math.log1p(sum(vocabulary[w] for w in _IMPERATIVE)),
        0.0 if head.isascii() else len(_NON_ASCII.findall(head)) / chars,
        len(_UPPER.findall(head)) / chars,
        min(sum(map(len, words)) / max(len(words), 1), 20.0) / 10.0,
    ]


def feature_matrix(texts: Sequence[str]) -> Array:
    """(len(texts), COUNT) float32."""
    return np.array([prompt_features(t) for t in texts], dtype=np.float32).reshape(len(texts), COUNT)
