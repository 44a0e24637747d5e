#!/usr/bin/env python3
"""Chaos run (issue 45): `rlhf run SPEC` with a seeded killer, beside an undisturbed run.

Runs the spec twice (same seed): once undisturbed ("calm"), once while a killer sends a
signal every GAP_MIN..GAP_MAX steps of metrics.jsonl (steps, not seconds, so a slow machine
gets the same schedule) to a worker of the next role in PLAN, chosen among that role's
ranks by the seed. Prints, per run: exit code and wall seconds; for the chaos run the
signals sent, the restarts rlhf recorded (restarts.jsonl) with each kind's time to recover,
whether every step is logged once, how many steps' rewards equal the calm run's, the last
10 steps' mean reward of both, and whether any process of the run is left.

Time to recover, by kind:
  - a relaunched worker (rollout, ref, ...): restarts.jsonl's ready_s, from the loss (the
    scheduler noticing the death, or the heartbeat timeout for a stopped one) to the worker
    serving again (registered, loaded, weights synced);
  - a restart of the job (an actor or critic rank): from the signal to the first step logged
    after it (first step), and to the first step past the one running when it was sent
    (back where it was: the steps after the checkpoint run again).

  bench/chaos.py RLHF SPEC OUT_DIR [--seed N] [--plan role:SIG,...] [--gap MIN,MAX]
                 [--delay S] [--no-calm] [--set PATH=VALUE]...
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return []


def run(rlhf, spec, name, out, sets, killer=None):
    cmd = [rlhf, "run", spec, "--set", f"name={name}", "--set", f"logger.run_dir={out}",
           "--set", "logger.dashboard_port=0"]
    for s in sets:
        cmd += ["--set", s]
    log = open(os.path.join(out, f"{name}.log"), "w")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    events, pids = [], set()
    if killer:
        events, pids = killer(proc, os.path.join(out, name), t0)
    code = proc.wait()
    return code, time.time() - t0, events, pids


def make_killer(seed, plan, gap, delay):
    rng = random.Random(seed)

    def kill(proc, run_dir, t0):
        events, pids = [], set()
        metrics = os.path.join(run_dir, "metrics.jsonl")
        at = rng.randint(*gap)
        k = 0
        while proc.poll() is None:
            records = lines(metrics)
            workers = lines_json(os.path.join(run_dir, "workers.json"))
            pids.update(w["pid"] for w in workers)
            if len(records) < at:
                time.sleep(0.02)
                continue
            if delay > 0:
                time.sleep(delay)
                workers = lines_json(os.path.join(run_dir, "workers.json"))
                pids.update(w["pid"] for w in workers)
            role, sig = plan[k % len(plan)]
            ranks = [w for w in workers if w["role"] == role]
            if ranks:
                w = rng.choice(ranks)
                try:
                    os.kill(w["pid"], getattr(signal, sig))
                    step = records[-1]["step"] if records else 0
                    events.append({"t": time.time() - t0, "role": role, "rank": w["rank"],
                                   "signal": sig, "step": step})
                except ProcessLookupError:
                    pass
            k += 1
            at += rng.randint(*gap)
        return events, pids

    return kill


def lines_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rlhf")
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--plan", default="rollout:SIGKILL,ref:SIGKILL,actor:SIGKILL,rollout:SIGSTOP")
    ap.add_argument("--gap", default="5,10")
    ap.add_argument("--delay", type=float, default=0.0,
                    help="seconds after the step record before each signal")
    ap.add_argument("--no-calm", action="store_true", help="no undisturbed run to compare with")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    plan = [tuple(p.split(":")) for p in a.plan.split(",")]
    gap = tuple(int(x) for x in a.gap.split(","))
    if not a.no_calm:
        code, wall, _, _ = run(a.rlhf, a.spec, "calm", a.out, a.set)
        print(f"calm:  exit {code}, {wall:.1f} s")
    arrivals = {}  # step -> seconds (from the start) each time its record appeared

    def killer(proc, run_dir, t0):
        stop = threading.Event()

        def watch():  # when each step's record appears (again, after a restart)
            metrics = os.path.join(run_dir, "metrics.jsonl")
            seen = set()
            while not stop.is_set():
                records = lines(metrics)
                present = set()
                for r in records:
                    present.add(r["step"])
                    if r["step"] not in seen:
                        seen.add(r["step"])
                        arrivals.setdefault(r["step"], []).append(time.time() - t0)
                seen &= present  # dropped by a restart: its next record is a new arrival
                time.sleep(0.02)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        events, pids = make_killer(a.seed, plan, gap, a.delay)(proc, run_dir, t0)
        proc.wait()
        stop.set()
        t.join()
        return events, pids

    code, wall, events, pids = run(a.rlhf, a.spec, "chaos", a.out, a.set, killer)
    print(f"chaos: exit {code}, {wall:.1f} s")
    sent = {}
    for e in events:
        sent[f"{e['role']} {e['signal']}"] = sent.get(f"{e['role']} {e['signal']}", 0) + 1
    print("  signals sent: " + ", ".join(f"{k} x{v}" for k, v in sorted(sent.items())))
    restarts = lines(os.path.join(a.out, "chaos", "restarts.jsonl"))
    by_role = {}
    for r in restarts:
        if r["kind"] == "worker":
            kind = f"{r['role']} ({'stopped' if r['cause'].startswith('stopped') else 'killed'})"
            by_role.setdefault(kind, []).append(r)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    for kind, rs in sorted(by_role.items()):
        ok = [r for r in rs if r["ready_s"] >= 0]
        print(f"  relaunched {kind}: {len(rs)}; on average registered again"
              f" {mean([r['registered_s'] for r in ok]):.2f} s after the loss was noticed,"
              f" revived (reload, weights) in {mean([r.get('revive_s', -1) for r in ok]):.2f} s,"
              f" serving {mean([r['ready_s'] for r in ok]):.2f} s after the loss (with any wait"
              f" for its group's next call); {len(rs) - len(ok)} lost again before they served")
    jobs = [r for r in restarts if r["kind"] == "job"]
    first, back = [], []
    for e in events:
        if e["role"] not in ("actor", "critic") or e["signal"] != "SIGKILL":
            continue
        # 0.1 s after the signal: the watcher may see the record that triggered it late; no
        # restart brings a step back that fast.
        after = [(s, t) for s, ts in arrivals.items() for t in ts if t > e["t"] + 0.1]
        if after:
            first.append(min(t for s, t in after) - e["t"])
            past = [t for s, t in after if s > e["step"]]
            if past:
                back.append(min(past) - e["t"])
    if jobs:
        causes = {}
        for j in jobs:
            causes[j["cause"][:60]] = causes.get(j["cause"][:60], 0) + 1
        print(f"  job restarts: {len(jobs)}")
        for c, n in sorted(causes.items(), key=lambda x: -x[1]):
            print(f"    x{n}: {c}")
    if first:
        print(f"  after a killed trainer rank: first step {sum(first) / len(first):.2f} s, back where"
              f" it was {sum(back) / max(1, len(back)):.2f} s on average ({len(first)} kills)")
    chaos_records = lines(os.path.join(a.out, "chaos", "metrics.jsonl"))
    chaos = {r["step"]: r for r in chaos_records}
    once = len(chaos) == len(chaos_records)
    print(f"  steps logged {len(chaos_records)} ({'each once' if once else 'SOME TWICE'})")
    if not a.no_calm:
        calm = {r["step"]: r for r in lines(os.path.join(a.out, "calm", "metrics.jsonl"))}
        same = sum(1 for s in calm
                   if s in chaos and chaos[s]["reward_mean"] == calm[s]["reward_mean"])
        print(f"  {same} of {len(calm)} steps with the calm run's reward to the bit")
        last = sorted(calm)[-10:]
        if last and all(s in chaos for s in last):
            m = lambda d: sum(d[s]["reward_mean"] for s in last) / len(last)
            print(f"  last 10 steps' mean reward: chaos {m(chaos):.4f}, calm {m(calm):.4f}")
    time.sleep(1)
    left = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            left.append(pid)
        except ProcessLookupError:
            pass
    print(f"  processes left: {len(left)} of {len(pids)} seen")
    return 0 if code == 0 and once and not left else 1


if __name__ == "__main__":
    sys.exit(main())
