"""Issue 44 replayed: each hostile-client case and each CLI input that once gave a traceback or a misleading
message, run against this checkout, with what it gave before (as the issue recorded it) beside what it gives now.

    python benchmarks/lab/hostile_before_after.py [--out benchmarks/results/DATE_cpu_hostile.json]

The server is `eaglekit serve` on 127.0.0.1 (a free port) with the shipped demo pair on CPU, --threads 1,
--read-timeout 5, --drain-timeout 1; probes are eaglekit.serve.hostile's (the hostile test tier runs the same).
Bounded: one 10 MB body, 10 + 10 stalled sockets for 8 s, a few dozen small requests, one CLI process per case.
Item 7 (the demo's chain pick under load) is measured elsewhere (benchmarks/lab/demo_under_load.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eaglekit.io import atomic_write_bytes  # noqa: E402
from eaglekit.serve import hostile as H  # noqa: E402
from eaglekit.serve.local import LocalServer  # noqa: E402

DEMO = ROOT / "eaglekit" / "assets" / "demo"
TARGET, DRAFT = DEMO / "target", DEMO / "draft"
REPS = 5  # the 10 MB probe, repeated: a shared machine's scheduling shows in any one run
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"


def server(log: Path) -> LocalServer:
    return LocalServer(["--target", str(TARGET), "--draft", str(DRAFT), "--served-model-name", "demo", "--threads",
                        "1", "--device", "cpu", "--dtype", "float32", "--log-level", "warning", "--max-batch", "2",
                        "--max-queue", "8", "--read-timeout", "5", "--drain-timeout", "1", "--chat-template",
                        TEMPLATE], log=log, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})


def cli(*argv, timeout=300) -> dict:
    """One `eaglekit` process: exit status, seconds, the last line of its error (or 'Traceback')."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "eaglekit", *argv], cwd=ROOT, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=timeout)
    err = p.stderr.decode(errors="replace")
    head = next((ln for ln in err.splitlines() if ln.startswith("eaglekit ")), "")
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1), "traceback": "Traceback" in err,
            "message": head[:220] if head else err.strip().splitlines()[-1][:220] if err.strip() else "",
            "stdout_bytes": len(p.stdout), "stdout": p.stdout.decode(errors="replace")[:2000]}


def folder(tmp: Path, name: str, src: Path, edit) -> str:
    d = tmp / name
    d.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def cli_rows(tmp: Path) -> list[dict]:
    t = str(TARGET)
    (tmp / "bad.txt").write_bytes(b"def f(\xff\xfe):")
    (tmp / "data.jsonl").write_text('{"text": 5}\n')
    (tmp / "a_file").write_text("x")
    (tmp / "adir").mkdir()
    (tmp / "long.txt").write_text("x = 1\n" * 1200)
    ids_str = folder(tmp, "draft_ids_str", DRAFT,
                     lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids="1,5,8"))
    neg = folder(tmp, "target_neg_layers", TARGET, lambda c: c.update(num_hidden_layers=-3))
    nohidden = folder(tmp, "target_no_hidden", TARGET, lambda c: c.pop("hidden_size"))
    strhidden = folder(tmp, "target_hidden_str", TARGET, lambda c: c.update(hidden_size="64"))
    g = ["generate", "--device", "cpu", "--max-new-tokens", "4", "--target"]
    serve = ["serve", "--target", t, "--device", "cpu"]
    cases = [
        ("4", "serve --port 99999", serve + ["--port", "99999"], "three tracebacks after 15 s"),
        ("4", "serve --threads -1", serve + ["--threads", "-1"], "traceback"),
        ("4", "serve --threads 0", serve + ["--threads", "0"], "accepted"),
        ("4", "serve --drain-timeout -5", serve + ["--drain-timeout", "-5"], "accepted"),
        ("4", "serve --spec-max-batch -1", serve + ["--spec-max-batch", "-1"], "accepted"),
        ("4", "serve --chat-template /nonexistent", serve + ["--chat-template", "/nonexistent"],
         "accepted: the path string became the template"),
        ("5", "generate --prompt with invalid UTF-8", g + [t, "--prompt", os.fsdecode(b"abc\xff")], "traceback"),
        ("5", "generate --prompt-file with invalid UTF-8", g + [t, "--prompt-file", str(tmp / "bad.txt")],
         "traceback"),
        ("5", "generate --seed 2^70", g + [t, "--prompt", "x", "--temperature", "1", "--seed",
                                           "1180591620717411303424"], "traceback"),
        ("5", "draft config ids as a string \"1,5,8\"", g + [t, "--draft", ids_str, "--prompt", "x"], "traceback"),
        ("5", "target config num_hidden_layers -3", g + [neg, "--prompt", "x"], "traceback"),
        ("5", "target config without hidden_size", g + [nohidden, "--prompt", "x"], "traceback"),
        ("5", "train --data {\"text\": 5}", ["train", "--target", t, "--data", str(tmp / "data.jsonl"), "--out",
                                            str(tmp / "run"), "--device", "cpu"], "traceback"),
        ("5", "train --out naming an existing file", ["train", "--target", t, "--data", str(DEMO / "prompts.jsonl"),
                                                      "--out", str(tmp / "a_file"), "--device", "cpu"], "traceback"),
        ("6", "target config hidden_size \"64\"", g + [strhidden, "--prompt", "x"],
         "E109: blamed on the tokenizer"),
        ("6", "prompt longer than the context", g + [t, "--prompt-file", str(tmp / "long.txt")],
         "E301: 'lower --max-new-tokens to 0'"),
        ("6", "a directory as --prompt-file", g + [t, "--prompt-file", str(tmp / "adir")], "E101: 'does not exist'"),
        ("6", "a file as --target", g + [str(tmp / "a_file"), "--prompt", "x"], "E101: 'does not exist'"),
    ]
    rows = []
    for item, case, argv, before in cases:
        r = cli(*argv)
        rows.append({"item": item, "case": case, "before": before,
                     "after": f"exit {r['rc']} in {r['seconds']} s" + (", TRACEBACK" if r["traceback"] else "")
                     + f": {r['message']}", "raw": r})
        print(f"  {case}: {rows[-1]['after']}", flush=True)
    # the doctor's report goes to stdout now: `doctor ... > report.txt` keeps it
    r = cli("doctor", "--target", t, "--draft", str(DRAFT), "--time-budget", "5", "--no-progress", "--prompts", "2")
    rows.append({"item": "6", "case": "doctor report on stdout", "before": "stderr: > report.txt left it empty",
                 "after": f"exit {r['rc']}; {r['stdout_bytes']} bytes on stdout", "raw": {**r, "stdout": None}})
    # generate --stop: the text ends before the stop string
    g12 = [*g[:-2], "12", "--target", t, "--prompt", "def f(x):", "--json"]
    full = json.loads(cli(*g12)["stdout"] or "{}").get("text", "")
    words = [w for w in full.split() if w.isalpha() and len(w) >= 3]
    stop = words[0] if words else None
    if stop:
        cut = json.loads(cli(*g12, "--stop", stop)["stdout"])["text"]
        after = (f"--stop {stop!r}: text {cut!r} of {full!r} (the stop string "
                 f"{'kept' if cut.endswith(stop) else 'left out'})")
    else:
        after = "no stop string to test in this continuation"
    rows.append({"item": "8", "case": "generate --stop S", "before": "S kept in the text (the server drops it)",
                 "after": after})
    return rows


def server_rows(log: Path) -> tuple[list[dict], dict]:
    srv = server(log)
    raw = {}
    rows = []
    try:
        runs = raw["big_body"] = [H.big_body(srv.port, "demo", mb=10) for _ in range(REPS)]

        def ms(key):  # median and worst over the runs, in ms
            v = sorted((r[key] or 0) * 1e3 for r in runs)
            return f"{v[len(v) // 2]:.0f} / {v[-1]:.0f}"

        rows.append({"item": "1", "case": f"a 10 MB prompt while another client streams ({REPS} runs; median / "
                                          f"worst)",
                     "before": "/health 7.5-9.6 s; the other stream stalled 9.8 s; no size limit",
                     "after": f"{sorted({r['status'] for r in runs})} after {ms('seconds')} ms; /health worst "
                              f"{ms('health_max_s')} ms during the upload ({ms('health_max_before_s')} ms in the "
                              f"second before it); the stream's longest gap {ms('stream_max_gap_s')} ms during it "
                              f"({ms('stream_max_gap_before_s')} ms before it; median gap {ms('stream_median_gap_s')} "
                              f"ms)"})
        print(f"  {rows[-1]['after']}", flush=True)
        bad = raw["malformed"] = H.malformed(srv.port, "demo")
        before = {"lone surrogate in the prompt": "500", "lone surrogate in a chat message":
                  "400 blaming the chat template", "seed 2**70": "500", "JSON nested 100,000 deep": "500",
                  "prompt longer than the context": "400"}
        for name, r in bad.items():
            rows.append({"item": "3" if name != "lone surrogate in a chat message" else "6", "case": name,
                         "before": before[name], "after": f"{r['status']} {r['code']} (param {r['param']}): "
                                                          f"{(r['message'] or '')[:120]}"})
        r = raw["stalled"] = H.stalled_uploads(srv.port, n=10, wait_s=8)
        rows.append({"item": "3", "case": "10 stalled bodies + 10 stalled headers, 8 s (--read-timeout 5)",
                     "before": "20 held sockets stayed open 60 s",
                     "after": f"held open after 8 s: {r['held_open_body']} bodies, {r['held_open_headers']} "
                              f"headers; bodies answered {r['statuses']}"})
        H.abandoned_uploads(srv.port, 5)
        time.sleep(0.5)
        tb = log.read_text().count("Traceback")
        rows.append({"item": "3", "case": "5 abandoned uploads", "before": "a traceback each in the log",
                     "after": f"{tb} tracebacks in the log"})
        r = raw["drain"] = H.drain_past_timeout(srv.port, "demo", lambda: os.kill(srv.proc.pid, signal.SIGTERM),
                                                lambda: srv.proc.wait(60))
        text = log.read_text()
        rows.append({"item": "2", "case": "SIGTERM past --drain-timeout 1: plain client",
                     "before": "plain-text 500", "after": f"{r['plain_status']} JSON {r['plain_error']}"})
        rows.append({"item": "2", "case": "SIGTERM past --drain-timeout 1: stream client",
                     "before": "cut: no error event, no [DONE]", "after": f"ends {r['stream_tail']}"})
        rows.append({"item": "2", "case": "SIGTERM past --drain-timeout 1: the log",
                     "before": "CancelledError tracebacks",
                     "after": f"exit {r['exit_status']} after {r['seconds_to_exit']} s; {text.count('Traceback')} "
                              f"tracebacks, {text.count('CancelledError')} CancelledError"})
    finally:
        srv.stop()
    return rows, raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                         f"{datetime.date.today().isoformat()}_cpu_hostile.json"))
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("server cases", flush=True)
        srows, raw = server_rows(tmp / "server.log")
        print("CLI cases", flush=True)
        crows = cli_rows(tmp)
    rows = sorted(srows + crows, key=lambda r: r["item"])
    print("\n| item | case | before (issue 44) | after |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['item']} | {r['case']} | {r['before']} | {r['after'].replace('|', '/')} |")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"script": "benchmarks/lab/hostile_before_after.py", "command": " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "git_sha": sha,
           "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version(),
                       "platform": platform.platform()},
           "seconds": round(time.time() - t0, 1), "rows": rows, "server_probes": raw}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1, default=str) + "\n").encode())
    print(f"\nwrote {args.out} ({doc['seconds']} s)")


if __name__ == "__main__":
    main()
