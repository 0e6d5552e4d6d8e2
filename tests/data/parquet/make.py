"""Writes the Parquet files the tests read, with the writers researchers use (pyarrow through
pandas' defaults, and polars). Not run by the tests; run it again after changing the fixture:

    python3 -m venv /tmp/pq && /tmp/pq/bin/pip install pyarrow polars
    /tmp/pq/bin/python tests/data/parquet/make.py
"""

import csv
import os

import polars
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
COLUMNS = ["source_id", "text", "goal_id", "goal", "question_id", "question", "reference"]

with open(os.path.join(ROOT, "experiments/data/fixture-table.csv"), newline="", encoding="utf-8") as file:
    rows = list(csv.DictReader(file))
fixture = pa.table({name: [row[name] for row in rows] for name in COLUMNS})

# The example: what pandas' to_parquet and pyarrow write by default (snappy).
pq.write_table(fixture, os.path.join(ROOT, "experiments/data/fixture-table.parquet"))
# gzip, and polars' default (zstd), which gacc refuses with advice.
pq.write_table(fixture, os.path.join(HERE, "fixture-gzip.parquet"), compression="gzip")
polars.from_arrow(fixture).write_parquet(os.path.join(HERE, "fixture-zstd.parquet"))

# Integer ids, a column gacc cannot read that the manifest does not name (a SQuAD-style
# `answers` struct), and a float column: the named columns alone are read.
numbered = pa.table(
    {
        "doc": [1, 1, 2],
        "context": ["Ann took tea.", "Ann took tea.", "Bob went home."],
        "gid": [10, 10, 20],
        "goal_text": ["who drinks what", "who drinks what", "where people go"],
        "qid": [100, 101, 102],
        "q": ["Who took tea?", "What did Ann take?", "Where did Bob go?"],
        "answer": ["Ann", "tea", "home"],
        "answers": [{"text": ["Ann"], "answer_start": [0]}, {"text": ["tea"], "answer_start": [9]}, {"text": ["home"], "answer_start": [9]}],
        "score": [0.5, 0.25, 1.0],
    }
)
pq.write_table(numbered, os.path.join(HERE, "numbered.parquet"))

# Every table error at once (rows numbered from 1): a source with two texts (row 2), a goal
# under two sources (row 3), a goal with two texts (row 4), a duplicate question id (row 5), a
# null question (row 6) and an empty reference (row 7).
bad = pa.table(
    {
        "source_id": ["s1", "s1", "s2", "s1", "s1", "s1", "s1"],
        "text": ["Text one", "Another text", "Text two", "Text one", "Text one", "Text one", "Text one"],
        "goal_id": ["g1", "g1", "g1", "g1", "g1", "g1", "g1"],
        "goal": ["Goal one", "Goal one", "Goal one", "Other goal", "Goal one", "Goal one", "Goal one"],
        "question_id": ["q1", "q2", "q3", "q4", "q1", "q6", "q7"],
        "question": ["Who?", "What?", "Where?", "When?", "Who again?", None, "Why?"],
        "reference": ["Ann", "Tea", "Home", "Noon", "Ann", "Tea", ""],
    }
)
pq.write_table(bad, os.path.join(HERE, "bad.parquet"))
