"""eaglekit's benchmark suite: one entry point, a registry of cases, one result schema.

    python -m benchmarks list                              # the suites and their cases
    python -m benchmarks run cpu-demo [--quick] [--out FILE] [--param key=value ...]
    python -m benchmarks compare A.json B.json            # two result files side by side, with ratios
    python -m benchmarks table RESULT.json                 # a markdown table (the README's headline table)

A case is a small function of its params that returns metrics (each a median / p10 / p90 / n / unit) and identity
checks; a suite is an ordered list of cases. Results follow benchmarks/schema.py ("eaglekit-bench/1") and are written
atomically after every case, so a run cut by a time limit keeps what it measured. A probe that measures one question
leaves the tree when its result file holds the figures and the command (git keeps it); benchmarks/lab/ keeps
deepseek_h200.py, which tests/models/test_deepseek.py runs.
"""
