"""The rate-limit benchmark's peer (tests/rate_limits.rs, GACC_PEER): inspect_ai answering the
same reader questions against the same mock server. Reads MOCK_URL, CALLS and DATA (the
benchmark's dataset, one source per line); MAX_CONNECTIONS sets inspect_ai's concurrency
(its default when unset)."""

import json
import os
import tempfile

from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.solver import generate


def samples():
    calls = int(os.environ["CALLS"])
    out = []
    with open(os.environ["DATA"]) as data:
        for line in data:
            source = json.loads(line)
            for goal in source["goals"]:
                for question in goal["questions"]:
                    prompt = f"<memory>\n{source['text']}\n</memory>\n\nQuestion: {question['question']}"
                    out.append(Sample(input=prompt, target=question["reference"], id=question["id"]))
    return out[:calls]


def main():
    os.environ.setdefault("OPENAI_API_KEY", "mock-key")
    task = Task(dataset=MemoryDataset(samples()), solver=generate())
    options = {}
    if os.environ.get("MAX_CONNECTIONS"):
        options["max_connections"] = int(os.environ["MAX_CONNECTIONS"])
    inspect_eval(
        task,
        model="openai/m",
        model_base_url=os.environ["MOCK_URL"],
        model_args={"responses_api": False},
        log_dir=tempfile.mkdtemp(),
        display="none",
        **options,
    )


if __name__ == "__main__":
    main()
