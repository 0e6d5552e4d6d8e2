#!/usr/bin/env python3
"""A gacc/1 compressor: keeps the sentences that share a word with the goal, best first.

gacc sends {"context", "goal" (None under no-goal), "token_budget", "seed", "params"}; return
the memory (anything past `token_budget` cl100k_base tokens is cut by gacc). `count_tokens` and
`fit` count and cut those tokens exactly as gacc does, so the budget is filled, never overrun.
print() goes to the call's log. The helper `gacc_callback` ({{helper}}) speaks the protocol (oneshot
or persistent: see its doc); try this by hand with
    printf 'The ferry leaves at nine. Tickets are sold on board.\n' > /tmp/source.txt
    cd callbacks && python3 -m gacc_callback try compress.py --context /tmp/source.txt --goal "plan a trip"
"""
import re
import sys

from gacc_callback import compressor, count_tokens, fit, serve

STOPWORDS = {"the", "a", "an", "of", "on", "in", "to", "and", "or", "for", "is", "are", "what", "how"}
# Scripts written without spaces (Chinese, Japanese, Korean): each character is a word, as
# gacc's own text rules take them.
CJK = "\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
WORD = re.compile(f"[{CJK}]|[^\\W{CJK}]+")
# A sentence ends after . ! ? and white space, after 。！？ (no space follows them), or at a line.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n")


def words(text):
    return set(WORD.findall(text.lower())) - STOPWORDS


@compressor
def compress(context, goal, token_budget, **_):
    sentences = [s for s in SENTENCE_END.split(context) if s.strip()]
    if goal:
        wanted = words(goal)
        # Most goal words first; ties keep the source's order.
        sentences.sort(key=lambda s: -len(wanted & words(s)))
    # Whole sentences, best first, while they fit; then as much of the next as fits.
    kept = []
    for sentence in sentences:
        if count_tokens(" ".join(kept + [sentence])) > token_budget:
            kept.append(sentence)
            break
        kept.append(sentence)
    memory = fit(" ".join(kept), token_budget)
    print(f"{len(sentences)} sentences, {count_tokens(memory)} of {token_budget} tokens kept")
    return memory


if __name__ == "__main__":
    sys.exit(serve())
