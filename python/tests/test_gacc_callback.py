"""The helper's own tests: each runs a small callback script as gacc would, in a subprocess."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import weakref

HELPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gacc_callback", "__init__.py")

# GACC_HELPER=installed: the scripts import the helper installed in this Python (gacc's wheel),
# not a copy of the repository's file beside them.
INSTALLED = os.environ.get("GACC_HELPER") == "installed"


class Callback:
    """A script written into a scratch folder beside a copy of the helper (or none, when the
    installed one is under test)."""

    def __init__(self, body):
        self.folder = tempfile.mkdtemp(prefix="gacc-helper-")
        # The scratch folder goes when the callback does (the test that made it ends).
        weakref.finalize(self, shutil.rmtree, self.folder, True)
        if not INSTALLED:
            with open(HELPER, encoding="utf-8") as source, open(os.path.join(self.folder, "gacc_callback.py"), "w", encoding="utf-8") as copy:
                copy.write(source.read())
        self.script = os.path.join(self.folder, "callback.py")
        with open(self.script, "w", encoding="utf-8") as script:
            script.write(textwrap.dedent(body))

    def run(self, requests, mode="oneshot", role="compressor"):
        """Sends the requests as gacc does; returns (replies, stderr, status). Each reply's framed
        `log` is taken out, as gacc takes it, and kept in `self.logs`; stderr is what the
        process wrote there followed by those logs (all the callback logged)."""
        env = {"PATH": os.environ.get("PATH", ""), "GACC_PROTOCOL": "gacc/1", "GACC_ROLE": role, "GACC_MODE": mode}
        text = "".join(json.dumps(r) + "\n" for r in requests) if mode == "persistent" else json.dumps(requests[0])
        done = subprocess.run([sys.executable, self.script], input=text, capture_output=True, text=True, env=env, cwd=self.folder, timeout=60)
        replies = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        self.logs = [reply.pop("log", "") if isinstance(reply, dict) else "" for reply in replies]
        return replies, done.stderr + "".join(self.logs), done.returncode


class CallLogs(unittest.TestCase):
    def test_each_calls_prints_and_traceback_come_framed_with_its_own_reply(self):
        callback = Callback("""
            import sys
            from gacc_callback import compressor, serve

            @compressor
            def compress(context, goal, **_):
                print("TOKEN=" + context)
                print("to stderr " + context, file=sys.stderr, flush=True)
                if context == "boom":
                    raise ValueError("no " + context)
                return context

            if __name__ == "__main__":
                sys.exit(serve())
        """)
        requests = [{"context": c, "goal": None, "token_budget": 5} for c in ["one", "boom", "three"]]
        replies, _, status = callback.run(requests, mode="persistent")
        self.assertEqual([r.get("memory") for r in replies], ["one", None, "three"])
        for context, log in zip(["one", "boom", "three"], callback.logs):
            self.assertIn("TOKEN=" + context + "\n", log)
            self.assertIn("to stderr " + context, log)
            others = {"one", "boom", "three"} - {context}
            self.assertFalse(any("TOKEN=" + other + "\n" in log for other in others), log)
        self.assertIn("ValueError: no boom", callback.logs[1])


COMPRESSOR = """
    import os
    from gacc_callback import compressor, serve, setup, usage

    calls = []

    @setup
    def load():
        calls.append("setup")
        print("loading the model")            # to the log, not the protocol
        os.write(1, b"a C library writing to fd 1\\n")

    @compressor
    def compress(context, goal, token_budget, **_):
        print("compressing", goal)
        os.write(1, b"more noise on fd 1\\n")
        kept = [line for line in context.splitlines() if goal and goal in line]
        return {"memory": "\\n".join(kept), "usage": usage(len(context), 3), "meta": {"setups": calls.count("setup")}}

    if __name__ == "__main__":
        raise SystemExit(serve())
"""


def request(goal, context="a ferry\nthe tide\na ferry pier"):
    return {"protocol": "gacc/1", "role": "compressor", "context": context, "goal": goal, "token_budget": 5, "seed": 0, "params": {}}


class OneshotAndPersistent(unittest.TestCase):
    def test_oneshot_answers_one_request_and_stdout_noise_goes_to_the_log(self):
        replies, stderr, status = Callback(COMPRESSOR).run([request("ferry")])
        self.assertEqual(status, 0, stderr)
        self.assertEqual(len(replies), 1)
        self.assertEqual(replies[0]["memory"], "a ferry\na ferry pier")
        self.assertEqual(replies[0]["usage"], {"input_tokens": 29, "output_tokens": 3, "cost_usd": 0.0})
        for noise in ["loading the model", "a C library writing to fd 1", "compressing ferry", "more noise on fd 1"]:
            self.assertIn(noise, stderr)

    def test_persistent_answers_each_line_in_order_with_one_setup(self):
        replies, stderr, status = Callback(COMPRESSOR).run([request("ferry"), request("tide"), request(None)], mode="persistent")
        self.assertEqual(status, 0, stderr)
        self.assertEqual([r["memory"] for r in replies], ["a ferry\na ferry pier", "the tide", ""])
        self.assertEqual({r["meta"]["setups"] for r in replies}, {1})


class Batches(unittest.TestCase):
    SCRIPT = """
        from gacc_callback import compressor, serve

        @compressor(batch_size=4)
        def compress(requests):
            if any(r["goal"] == "boom" for r in requests):
                raise ValueError("the batch broke")
            return [{"memory": r["goal"].upper(), "meta": {"batch": len(requests)}} for r in requests]

        if __name__ == "__main__":
            raise SystemExit(serve())
    """

    def test_a_batch_function_takes_what_has_arrived_and_each_reply_keeps_its_id(self):
        requests = [dict(request(f"g{i}"), id=i + 1) for i in range(10)]
        replies, stderr, status = Callback(self.SCRIPT).run(requests, mode="persistent")
        self.assertEqual(status, 0, stderr)
        self.assertEqual(sorted(r["id"] for r in replies), list(range(1, 11)))
        for reply in replies:
            self.assertEqual(reply["memory"], f"G{reply['id'] - 1}")
        # All ten were waiting at once: batches of at most four, so at least three.
        self.assertTrue(all(r["meta"]["batch"] <= 4 for r in replies))
        self.assertGreater(max(r["meta"]["batch"] for r in replies), 1)

    def test_a_failed_batch_answers_each_of_its_requests_with_the_error(self):
        replies, stderr, status = Callback(self.SCRIPT).run([dict(request("boom"), id=7)], mode="persistent")
        self.assertEqual(status, 1)
        self.assertEqual(replies, [{"error": "ValueError: the batch broke", "retryable": False, "id": 7}])
        self.assertIn("the batch broke", stderr)

    def test_a_batch_function_serves_oneshot_too(self):
        replies, stderr, status = Callback(self.SCRIPT).run([request("one")])
        self.assertEqual((status, replies[0]["memory"]), (0, "ONE"), stderr)


class Failures(unittest.TestCase):
    SCRIPT = """
        from gacc_callback import Retryable, reader, serve

        @reader
        def read(memory, question, **_):
            if "busy" in question:
                raise Retryable("the model server is busy")
            if "boom" in question:
                raise ValueError("no such field")
            return memory.upper()

        if __name__ == "__main__":
            raise SystemExit(serve())
    """

    def ask(self, question, mode="oneshot"):
        item = {"protocol": "gacc/1", "role": "reader", "memory": "blue", "question": question, "seed": 0, "params": {}}
        return Callback(self.SCRIPT).run([item], mode=mode, role="reader")

    def test_a_returned_value_is_the_roles_field(self):
        replies, _, status = self.ask("what colour?")
        self.assertEqual((replies, status), ([{"answer": "BLUE"}], 0))

    def test_an_exception_is_an_explained_failure_with_its_traceback_in_the_log(self):
        replies, stderr, status = self.ask("boom")
        self.assertEqual(replies, [{"error": "ValueError: no such field", "retryable": False}])
        self.assertEqual(status, 1)
        self.assertIn("Traceback", stderr)

    def test_retryable_asks_for_a_retry_and_a_persistent_worker_serves_on(self):
        replies, _, _ = self.ask("busy")
        self.assertEqual(replies, [{"error": "the model server is busy", "retryable": True}])
        callback = Callback(self.SCRIPT)
        items = [{"protocol": "gacc/1", "role": "reader", "memory": "m", "question": q, "seed": 0, "params": {}} for q in ["boom", "ok"]]
        replies, _, _ = callback.run(items, mode="persistent", role="reader")
        self.assertEqual(replies[1], {"answer": "M"})

    def test_a_ladder_answers_every_budget_and_a_single_budget_as_a_ladder_of_one(self):
        callback = Callback("""
            from gacc_callback import compressor, serve

            @compressor(ladder=True)
            def compress(context, token_budgets, **_):
                ranked = context.split()          # ranked once, cut for each budget
                return [" ".join(ranked[:budget]) for budget in token_budgets]

            serve()
        """)
        base = {"protocol": "gacc/1", "role": "compressor", "context": "a b c d", "goal": None, "seed": 0, "params": {}}
        ladder = dict(base, token_budgets=[1, 3], id=7)
        single = dict(base, token_budget=2, id=8)
        replies, _, _ = callback.run([ladder, single], mode="persistent")
        self.assertEqual(replies, [{"memories": ["a", "a b c"], "id": 7}, {"memory": "a b", "id": 8}])

    def test_a_single_budget_compressor_refuses_a_ladder(self):
        callback = Callback("""
            from gacc_callback import compressor, serve

            @compressor
            def compress(context, token_budget, **_):
                return context

            serve()
        """)
        request = {"protocol": "gacc/1", "role": "compressor", "context": "x", "goal": None, "seed": 0, "params": {}, "token_budgets": [1, 2]}
        replies, _, _ = callback.run([request])
        self.assertEqual(replies[0]["retryable"], False)
        self.assertIn("ladder", replies[0]["error"])

    def test_a_request_that_is_not_json_is_answered_with_an_error(self):
        callback = Callback(self.SCRIPT)
        env = {"PATH": os.environ.get("PATH", ""), "GACC_ROLE": "reader", "GACC_MODE": "oneshot"}
        done = subprocess.run([sys.executable, callback.script], input="{not json", capture_output=True, text=True, env=env, cwd=callback.folder, timeout=60)
        reply = json.loads(done.stdout)
        self.assertFalse(reply["retryable"])
        self.assertIn("not JSON", reply["error"])


class Unsendable(unittest.TestCase):
    SCRIPT = """
        from gacc_callback import judge, serve

        @judge
        def judge_(question, **_):
            if question == "nan":
                return {"correct": True, "score": float("nan")}
            if question == "set":
                return {"correct": True, "meta": {"seen": {1, 2}}}
            return {"correct": True}

        if __name__ == "__main__":
            raise SystemExit(serve())
    """

    def item(self, question, **extra):
        return dict({"protocol": "gacc/1", "role": "judge", "source": "s", "question": question, "reference": "r", "answer": "a", "seed": 0, "params": {}}, **extra)

    def test_nan_and_unserialisable_replies_are_error_replies_and_the_worker_serves_on(self):
        replies, stderr, status = Callback(self.SCRIPT).run([self.item("nan")], role="judge")
        self.assertEqual(status, 1, stderr)
        self.assertIn("not JSON", replies[0]["error"])
        replies, stderr, _ = Callback(self.SCRIPT).run([self.item("set"), self.item("nan"), self.item("ok")], mode="persistent", role="judge")
        self.assertEqual(len(replies), 3, stderr)
        self.assertIn("not JSON", replies[0]["error"])
        self.assertIn("not JSON", replies[1]["error"])
        self.assertEqual(replies[2], {"correct": True})

    def test_every_malformed_line_gets_an_error_reply_in_every_mode(self):
        batched = Batches.SCRIPT
        for script, role in [(self.SCRIPT, "judge"), (batched, "compressor")]:
            callback = Callback(script)
            good = self.item("ok", id=1) if role == "judge" else dict(request("g"), id=1)
            lines = json.dumps(good) + "\nnot json\n[1, 2]\n"
            env = {"PATH": os.environ.get("PATH", ""), "GACC_ROLE": role, "GACC_MODE": "persistent"}
            done = subprocess.run([sys.executable, callback.script], input=lines, capture_output=True, text=True, env=env, cwd=callback.folder, timeout=60)
            replies = [json.loads(line) for line in done.stdout.splitlines()]
            self.assertEqual(len(replies), 3, (role, done.stdout, done.stderr))
            self.assertNotIn("error", replies[0])
            self.assertIn("not JSON", replies[1]["error"])
            self.assertIn("not a JSON object", replies[2]["error"])
            self.assertEqual(done.returncode, 1, role)


class TryByHand(unittest.TestCase):
    def test_try_calls_a_scripts_function_and_prints_its_reply(self):
        callback = Callback(COMPRESSOR)
        context = os.path.join(callback.folder, "source.txt")
        with open(context, "w", encoding="utf-8") as file:
            file.write("one ferry\ntwo\n")
        done = subprocess.run(
            [sys.executable, "-m", "gacc_callback", "try", callback.script, "--role", "compressor", "--context", context, "--goal", "ferry", "--budget", "20"],
            capture_output=True, text=True, cwd=callback.folder, timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout)["memory"], "one ferry")

    def test_without_a_command_it_prints_its_usage(self):
        callback = Callback(COMPRESSOR)
        done = subprocess.run([sys.executable, "-m", "gacc_callback"], capture_output=True, text=True, cwd=callback.folder, timeout=60)
        self.assertEqual(done.returncode, 2)
        self.assertIn("usage: python -m gacc_callback COMMAND", done.stderr)

    def test_help_documents_the_commands(self):
        callback = Callback(COMPRESSOR)
        done = subprocess.run([sys.executable, "-m", "gacc_callback", "--help"], capture_output=True, text=True, cwd=callback.folder, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("try SCRIPT", done.stdout)

    def test_a_try_that_cannot_be_made_says_why_in_one_line(self):
        callback = Callback(COMPRESSOR)
        broken = os.path.join(callback.folder, "broken.py")
        with open(broken, "w", encoding="utf-8") as file:
            file.write("import gacc_callback\nraise ImportError('no module named torch')\n")
        for argv, said in [
            (["try", callback.script, "--context", "missing.txt"], "cannot read missing.txt"),
            (["try", "nowhere.py"], "no script at nowhere.py"),
            (["try", broken], "broken.py:2: ImportError: no module named torch"),
        ]:
            done = subprocess.run([sys.executable, "-m", "gacc_callback", *argv], capture_output=True, text=True, cwd=callback.folder, timeout=60)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertIn(said, done.stderr)


class WhichHelper(unittest.TestCase):
    def test_the_scripts_import_the_helper_under_test(self):
        callback = Callback("""
            import gacc_callback, sys
            sys.stdout.write(gacc_callback.__file__)
        """)
        done = subprocess.run([sys.executable, callback.script], capture_output=True, text=True, cwd=callback.folder, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        imported = os.path.realpath(done.stdout)
        if INSTALLED:
            # The wheel's package, in this Python's site-packages: neither the repository's
            # source nor a copy beside the script.
            self.assertTrue(imported.endswith(os.path.join("site-packages", "gacc_callback", "__init__.py")), imported)
        else:
            self.assertEqual(imported, os.path.realpath(os.path.join(callback.folder, "gacc_callback.py")))


if __name__ == "__main__":
    unittest.main()
