#!/usr/bin/env python3
"""A gacc/1 compressor: keeps the sentences and lines that share a word with the goal."""
import json
import re
import sys


def words(text):
    return set(re.findall(r"\w+", text.lower()))


def main():
    request = json.load(sys.stdin)  # one JSON object on stdin
    context = request["context"]
    goal = request["goal"]  # None under the no-goal condition
    budget = request["token_budget"]  # cl100k_base tokens; gacc cuts anything longer
    pieces = [p for p in re.split(r"(?<=[.!?])\s+|\n", context) if p.strip()]
    if goal:
        wanted = words(goal) - {"the", "a", "an", "of", "on", "to", "and"}
        pieces = [p for p in pieces if wanted & words(p)]
    print(f"kept {len(pieces)} pieces for a budget of {budget}", file=sys.stderr)  # the log
    json.dump({"memory": "\n".join(pieces)}, sys.stdout)  # one JSON object on stdout


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # explained failures are reported, never cached
        json.dump({"error": f"{type(error).__name__}: {error}", "retryable": False}, sys.stdout)
        sys.exit(1)
