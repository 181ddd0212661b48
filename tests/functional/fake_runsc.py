#!/usr/bin/env python3
"""A fake runsc for functional tests of thaw's CLI sandboxes: it keeps container
state in <root>/fake/<id>.json, records every argv in <root>/fake/argv.jsonl,
and runs a "workload" child that writes to the stdout/stderr runsc was given
(as runsc hands its stdio to the sandbox) until it is killed or told to crash
(<root>/fake/<id>.crash holding an exit code). Errors go to stderr and, with
--log, as a JSON line to the log, like runsc/cmd/util.Errorf.
"""
import json
import os
import signal
import sys
import time

argv = sys.argv[1:]
flags = {}
i = 0
while i < len(argv) and argv[i].startswith("-"):
    k, _, v = argv[i].lstrip("-").partition("=")
    flags[k] = v
    i += 1
cmd, args = (argv[i], argv[i + 1:]) if i < len(argv) else ("", [])
opts = {a.lstrip("-").partition("=")[0]: a.partition("=")[2] for a in args if a.startswith("--")}
words = [a for a in args if not a.startswith("--")]

if "version" in flags:
    print("runsc version fake-1\nspec: 1.1.0")
    sys.exit(0)
if cmd == "cpu-features":   # the compatibility tuple (control/node/compat.py); FAKE_CPU_FEATURES overrides
    print(os.environ.get("FAKE_CPU_FEATURES", "fpu,sse,sse2"))
    sys.exit(0)

state_dir = os.path.join(flags["root"], "fake")
os.makedirs(state_dir, exist_ok=True)
with open(os.path.join(state_dir, "argv.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\n")


def fail(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    if flags.get("log"):
        with open(flags["log"], "a") as f:
            f.write(json.dumps({"msg": msg, "level": "error", "time": "2026-11-30T00:00:00Z"}) + "\n")
    sys.exit(128)


def path(cid: str) -> str:
    return os.path.join(state_dir, f"{cid}.json")


def marker(cid: str) -> str:
    """The state file real runsc keeps per container, which Runsc.exists looks for
    (runsc_hooks/runsc.py): <root>/<id>_sandbox:<sandbox id>.state."""
    return os.path.join(flags["root"], f"{cid}_sandbox:{cid}.state")


def load(cid: str) -> dict:
    try:
        with open(path(cid)) as f:
            return json.load(f)
    except FileNotFoundError:
        fail(f"loading container: file does not exist: {cid}")


def save(cid: str, st: dict) -> None:
    tmp = path(cid) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.rename(tmp, path(cid))


def workload(cid: str) -> None:
    """The sandbox: writes to the stdio it inherited until killed or told to crash."""
    os.setsid()
    print(f"fake workload {cid}: hello", flush=True)
    sys.stderr.write(f"fake workload {cid}: on stderr\n")
    sys.stderr.flush()
    crash = os.path.join(state_dir, f"{cid}.crash")
    # Gone with its state file (a test's tmp dir removed without a delete) or
    # after 10 minutes: a fake sandbox never outlives its test for long.
    deadline = time.monotonic() + 600
    while not os.path.exists(crash):
        if not os.path.exists(path(cid)) or time.monotonic() > deadline:
            os._exit(0)
        time.sleep(0.02)
    code = int(open(crash).read().strip() or 1)
    print(f"fake workload {cid}: exiting {code}", flush=True)
    st = load(cid)
    st.update(status="stopped", exit=code, pid=-1)
    save(cid, st)
    os._exit(code)


def spawn(cid: str, bundle: str, status: str) -> None:
    if os.path.exists(path(cid)):
        fail(f"container with id {cid} already exists")
    with open(os.path.join(bundle, "config.json")) as f:
        json.load(f)
    save(cid, {"id": cid, "status": "creating", "pid": 0, "bundle": bundle})
    open(marker(cid), "w").close()
    pid = os.fork()
    if pid == 0:
        workload(cid)
    save(cid, {"id": cid, "status": status, "pid": pid, "bundle": bundle})


def kill_child(st: dict) -> None:
    if st.get("pid", 0) > 0:
        try:
            os.killpg(st["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


cid = words[-1] if words else ""
if cmd == "create":
    spawn(cid, opts["bundle"], "created")
elif cmd == "start":
    st = load(cid)
    st["status"] = "running"
    save(cid, st)
elif cmd == "state":
    print(json.dumps(load(cid)))
elif cmd == "list":
    out = []
    for n in sorted(os.listdir(state_dir)):
        if n.endswith(".json"):
            with open(os.path.join(state_dir, n)) as f:
                out.append(json.load(f))
    print(json.dumps(out))
elif cmd == "wait" and "restore" in opts:
    # `runsc wait --restore`: this fake's restore has no background loading; it is done.
    load(cid)
    print(json.dumps({"id": cid, "exitStatus": 0}))
elif cmd == "wait":
    while True:
        st = load(cid)
        if st["status"] == "stopped":
            print(json.dumps({"id": cid, "exitStatus": st.get("exit", 0)}))
            break
        time.sleep(0.02)
elif cmd == "kill":
    cid = words[0]
    st = load(cid)
    kill_child(st)
    st.update(status="stopped", exit=128 + int(words[1]), pid=-1)
    save(cid, st)
elif cmd == "delete":
    if not os.path.exists(path(cid)):
        fail(f"loading container: file does not exist: {cid}")
    kill_child(load(cid))
    os.unlink(path(cid))
    if os.path.exists(marker(cid)):
        os.unlink(marker(cid))
elif cmd == "events":
    # events --stats ID: runsc's stats line; the memory usage from FAKE_RUNSC_MEMORY (bytes).
    load(cid)
    usage = int(os.environ.get("FAKE_RUNSC_MEMORY", str(1 << 20)))
    print(json.dumps({"type": "stats", "id": cid, "data": {"memory": {"usage": {"limit": 0, "usage": usage}}}}))
elif cmd == "checkpoint":
    load(cid)
    if os.environ.get("FAKE_RUNSC_CHECKPOINT_SLEEP"):
        time.sleep(float(os.environ["FAKE_RUNSC_CHECKPOINT_SLEEP"]))
    if os.environ.get("FAKE_RUNSC_CHECKPOINT_FAIL"):
        fail(os.environ["FAKE_RUNSC_CHECKPOINT_FAIL"])
    img = opts["image-path"]
    os.makedirs(img)
    for name, size in (("checkpoint.img", 4096), ("pages_meta.img", 64), ("pages.img", 8192)):
        with open(os.path.join(img, name), "wb") as f:
            f.write(b"\1" * size)
elif cmd == "restore":
    for name in ("checkpoint.img", "pages.img"):
        if not os.path.exists(os.path.join(opts["image-path"], name)):
            fail(f"restore: {name} missing")
    spawn(cid, opts["bundle"], "running")
elif cmd == "ps":
    load(cid)
    print(json.dumps([1, 7]))   # pids only, as runsc (control.PrintPIDsJSON) and runc print them
elif cmd == "exec":
    # exec ID ARGV...: the CUDA helper's --get-state answers from FAKE_CUDA_STATES
    # ({"pid": "state"}; other pids: not a CUDA process, exit 1).
    cid, rest = args[0], args[1:]
    load(cid)
    if rest and rest[0].endswith("cuda-checkpoint"):
        states = json.loads(os.environ.get("FAKE_CUDA_STATES", "{}"))
        pid = rest[rest.index("--pid") + 1]
        if "--get-state" in rest:
            if pid not in states:
                sys.stderr.write("thaw-cuda-checkpoint: get-state of pid %s failed\n" % pid)
                sys.exit(1)
            print(states[pid])
else:
    fail(f"fake runsc: unknown command {cmd!r}")
