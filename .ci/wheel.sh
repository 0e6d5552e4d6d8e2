#!/usr/bin/env bash
# CI, after `cargo test`: the wheel `pip install ./` builds (the gacc binary and the helper),
# installed into a fresh venv and used from a shell with no Rust on PATH. The fixture must give
# what the cargo build gives, byte for byte; the helper's tests must pass against the installed
# module; and the compressor `gacc init` writes on it must pass `gacc callback check` and run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--without-rust" ]; then
    work=$2
    if command -v cargo || command -v rustc; then
        echo "wheel check: Rust is on PATH in the shell that should not have it" >&2
        exit 1
    fi
    [ "$(command -v gacc)" = "$work/venv/bin/gacc" ]
    gacc --version

    # The fixture through the wheel's gacc: the same figures, rows and memories as the cargo build.
    cp -r experiments "$work/wheel"
    (cd "$work/wheel" && gacc run -q fixture.toml >run-folder)
    # The rows, decompressed (where a gzip member ends depends on when the run flushed).
    for file in results.jsonl.gz memories.jsonl.gz; do
        cmp <(zcat "$work/cargo/$(cat "$work/cargo/run-folder")/$file") <(zcat "$work/wheel/$(cat "$work/wheel/run-folder")/$file")
    done
    python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
def report(build):
    folder = open(f"{work}/{build}/run-folder").read().strip()
    return json.load(open(f"{work}/{build}/{folder}/report.json"))
cargo, wheel = report("cargo"), report("wheel")
for key in ["cells", "by_condition", "dataset", "integrity"]:
    assert cargo[key] == wheel[key], f"report.json `{key}` differs between the cargo and the wheel build"
# The fixture's figures (README): Micro 2/3 and Macro 0 on every seed.
for cell in wheel["cells"]:
    assert (cell["micro"]["mean"], cell["macro"]["mean"]) == (2 / 3, 0.0), cell
print(f"wheel check: the fixture gives {len(wheel['cells'])} cell(s) at Micro 2/3, Macro 0, as the cargo build")
EOF

    # The helper's own tests, importing the installed module (none is copied beside the scripts).
    GACC_HELPER=installed python3 -m unittest discover -s python/tests

    # A compressor written on the installed helper: gacc init uses it, it passes the check, it runs.
    (
        cd "$work"
        gacc init study 2>init.log
        cat init.log
        grep -q "imports the installed helper" init.log
        test ! -e study/callbacks/gacc_callback.py
        gacc callback check study/experiment.toml
        gacc run -q study/experiment.toml
    )
    echo "wheel check: passed"
    exit 0
fi

work=$(mktemp -d /tmp/gacc-ci-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "wheel check: building the wheel in $work"
# Built as `pip install ./` builds it (maturin in an isolated build environment), but in the
# dev profile: the program is the same, and the wheel reuses what `cargo test` just built in
# target/debug instead of a release build of every dependency (minutes on two cores). A user's
# `pip install ./` is a release build.
python3 -m venv "$work/build"
MATURIN_PEP517_ARGS="--profile dev" "$work/build/bin/pip" wheel --quiet --no-deps --wheel-dir "$work/dist" ./
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index "$work"/dist/gacc-*.whl

# The reference: the fixture run by the cargo build the tests used.
repo=$PWD
cp -r experiments "$work/cargo"
(cd "$work/cargo" && "$repo/target/debug/gacc" run -q fixture.toml >run-folder)

mkdir "$work/home"
env -i HOME="$work/home" LANG=C.UTF-8 PATH="$work/venv/bin:/usr/local/bin:/usr/bin:/bin" \
    bash .ci/wheel.sh --without-rust "$work"
