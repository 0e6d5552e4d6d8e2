#!/usr/bin/env python3
"""A gacc/1 compressor: keeps the sentences that share a word with the goal, best first.

gacc writes one JSON request to stdin: {"context", "goal" (null under no-goal),
"token_budget", "seed", "params"}; write one JSON object to stdout: {"memory": "..."}.
Anything past `token_budget` cl100k_base tokens is cut by gacc. Log to stderr.
"""
import json
import re
import sys

STOPWORDS = {"the", "a", "an", "of", "on", "in", "to", "and", "or", "for", "is", "are", "what", "how"}


def words(text):
    return set(re.findall(r"\w+", text.lower())) - STOPWORDS


def compress(request):
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n", request["context"]) if s.strip()]
    goal = request.get("goal")
    if goal:
        wanted = words(goal)
        # Most goal words first; ties keep the source's order.
        sentences.sort(key=lambda s: -len(wanted & words(s)))
    return {"memory": " ".join(sentences)}


def main():
    request = json.load(sys.stdin)
    response = compress(request)
    print(f"kept {len(response['memory'])} characters for a budget of {request['token_budget']}", file=sys.stderr)
    json.dump(response, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # an explained failure: reported, never cached
        json.dump({"error": f"{type(error).__name__}: {error}", "retryable": False}, sys.stdout)
        sys.exit(1)
