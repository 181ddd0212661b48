#!/usr/bin/env python3
"""Reread a soak.json written before the fix of 2026-12-05 (bench/gpu/soak.py, node.py
`Node.decisions` from the start's mark; names per lap): in those runs the park rounds reused
their container names in every lap, and a start's check "the stand-in restored it" / "adopted
a parked sandbox" compared every decision ever logged for the name. This prints the table the
fixed harness would have written, by two rules and nothing else:

- a park row that failed and whose decisions *end* with adopt, restored (this start's own) is
  counted ok: its other checks (the nonce through its own spool, the holders, identical answers,
  the CUDA wake, the GPU) are separate checks, and the row would have named them;
- each park rounds' template (steps `park_template`) is a cache row, ok when its decisions end
  restore, restored and its boot id is the cold process's.

    python3 bench/gpu/soak_reread.py bench/results/gpu-soak-2026-12-05-gpt2-large-a.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_summary import per_kind  # noqa: E402

STALE_ONLY = ("the start adopted a parked sandbox", "park-template: the stand-in restored it")


def reread(d: dict) -> dict:
    rows, fixed = [], []
    for r in d["restores"]:
        r = dict(r)
        reasons = [x.strip() for x in (r.get("reason") or "").split(";") if x.strip()]
        if not r["ok"] and r["kind"] == "park" and r.get("container") and r["decisions"][-2:] == ["adopt", "restored"] \
                and reasons and all(any(s in x for s in STALE_ONLY) for x in reasons):
            r["ok"], r["reason"] = True, None
            fixed.append(r["i"])
        rows.append(r)
    for s in (x for x in d["steps"] if x.get("step") == "park_template"):
        dec = [x["decision"] for x in s.get("decisions") or []]
        ok = dec[-2:] == ["restore", "restored"] and s.get("boot") == d["cold"]["boot"]
        rows.append({"kind": "cache", "model": d["model"], "profile": d.get("profile", "pytorch"),
                     "t": s.get("first_answer_s"), "ok": ok, "container": s.get("container"),
                     "reason": None if ok else f"park template: {dec[-2:]}, boot {s.get('boot')}"})
    return {"fixed_rows": fixed, "failed": [{k: r.get(k) for k in ("i", "kind", "container", "t", "reason")}
                                            for r in rows if not r["ok"]], "soak": per_kind(rows)}


if __name__ == "__main__":
    print(json.dumps(reread(json.loads(Path(sys.argv[1]).read_text())), indent=1))
