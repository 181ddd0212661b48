import pytest

from control.lifecycle import workload
from control.errors import UserError
from runsc_hooks import probe
from runsc_hooks import spec as specmod


def spec(ann=None, args=("/app/run.sh",), env=None, devices=None):
    s = specmod.command_spec(list(args), rootfs="r", annotations=ann or {}, env=env or {})
    if devices:
        s["linux"]["devices"] = devices
    return s


def test_not_opted_in():
    assert workload.from_spec(spec()) is None and not workload.opted_in(spec())


def test_key_is_stable_and_covers_identity():
    a = workload.from_spec(spec({"thaw.dev/workload": "web"}))
    assert a.key == workload.from_spec(spec({"thaw.dev/workload": "web"})).key
    assert a.key.startswith("default.web.")
    assert a.key != workload.from_spec(spec({"thaw.dev/workload": "web"}, args=("/app/other",))).key
    assert a.key != workload.from_spec(spec({"thaw.dev/workload": "web", "thaw.dev/tenant": "t2"})).key
    gpu = [{"path": "/dev/nvidia0", "type": "c"}]
    assert a.key != workload.from_spec(spec({"thaw.dev/workload": "web"}, devices=gpu)).key


def test_env_counts_only_when_listed():
    base = {"thaw.dev/workload": "web"}
    k1 = workload.from_spec(spec(base, env={"MODEL": "a", "NOISE": "1"})).key
    k2 = workload.from_spec(spec(base, env={"MODEL": "b", "NOISE": "2"})).key
    assert k1 == k2
    listed = {**base, "thaw.dev/key-env": "MODEL"}
    assert workload.from_spec(spec(listed, env={"MODEL": "a"})).key != workload.from_spec(spec(listed, env={"MODEL": "b"})).key


def test_probes_and_their_defaults():
    # No readiness probe: never checkpointed automatically; a restore checks it runs.
    w = workload.from_spec(spec({"thaw.dev/workload": "web"}))
    assert (w.ready, w.health) == (None, probe.RunningProbe())
    w = workload.from_spec(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "file:/tmp/ready"}))
    assert w.health == w.ready == probe.FileProbe("/tmp/ready")
    # The one grammar: http/gpu/tcp probes work in annotations too.
    w = workload.from_spec(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "http:8000/health"}))
    assert w.health == w.ready == probe.HttpProbe(8000, "/health")
    w = workload.from_spec(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "delay:5"}))
    assert (w.ready, w.health) == (probe.DelayProbe(5.0), probe.RunningProbe())
    w = workload.from_spec(spec({"thaw.dev/workload": "web", "thaw.dev/health": "exec:true"}))
    assert w.health == probe.ExecProbe(("true",))


@pytest.mark.parametrize("ann, field", [
    ({"thaw.dev/workload": "bad name!"}, "thaw.dev/workload"),
    ({"thaw.dev/workload": "w", "thaw.dev/tenant": ""}, "thaw.dev/tenant"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "http:/x"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "ftp:21"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "delay:soon"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/health": "file:relative"}, "thaw.dev/health"),
])
def test_bad_annotations_name_the_field(ann, field):
    with pytest.raises(UserError) as e:
        workload.from_spec(spec(ann))
    assert e.value.fields["field"] == field


def test_thaw_annotations_are_bounded():
    """thawd reads any container's annotations: a value over the bound is refused before parsing."""
    from control.lifecycle.workload import MAX_ANNOTATION_BYTES
    spec = specmod.command_spec(["/app"], rootfs="r", annotations={
        "thaw.dev/workload": "w", "thaw.dev/ready": "exec:" + "x" * MAX_ANNOTATION_BYTES})
    with pytest.raises(UserError, match="thaw.dev/ready is .* bytes, more than"):
        workload.from_spec(spec)
    spec["annotations"]["thaw.dev/ready"] = "file:/tmp/ready"
    spec["annotations"]["other.example/huge"] = "y" * (2 * MAX_ANNOTATION_BYTES)   # not thaw's: the file bound covers it
    assert workload.from_spec(spec).ready is not None
