#!/usr/bin/env python3
"""A gacc/1 compressor on the Python helper: keeps the sentences and lines that share a word
with the goal. The same script serves oneshot and persistent mode (gacc says which)."""
import os
import re
import sys

try:
    from gacc_callback import compressor, serve
except ImportError:  # not installed: the helper in gacc's repository (granted in the manifest)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    from gacc_callback import compressor, serve

STOPWORDS = {"the", "a", "an", "of", "on", "to", "and"}


def words(text):
    return set(re.findall(r"\w+", text.lower()))


@compressor
def goal_sentences(context, goal, token_budget, **_):
    pieces = [p for p in re.split(r"(?<=[.!?])\s+|\n", context) if p.strip()]
    if goal:  # None under the no-goal condition
        wanted = words(goal) - STOPWORDS
        pieces = [p for p in pieces if wanted & words(p)]
    print(f"kept {len(pieces)} pieces for a budget of {token_budget}")  # goes to the log
    return "\n".join(pieces)  # gacc cuts anything past token_budget tokens


if __name__ == "__main__":
    sys.exit(serve())
