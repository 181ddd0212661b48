import pytest

from control.lifecycle import workload
from control.errors import IdentityError, UserError
from runsc_hooks import probe
from runsc_hooks import spec as specmod


TENANT = "ctr-a"
IMAGE = "sha256:" + "1" * 64


def spec(ann=None, args=("/app/run.sh",), env=None, devices=None):
    s = specmod.command_spec(list(args), rootfs="r", annotations=ann or {}, env=env or {})
    if devices:
        s["linux"]["devices"] = devices
    return s


def wl(sp, tenant=TENANT, image=IMAGE):
    return workload.from_spec(sp, tenant, image)


def test_not_opted_in():
    assert wl(spec()) is None and not workload.opted_in(spec())


def test_key_is_stable_and_covers_identity():
    a = wl(spec({"thaw.dev/workload": "web"}))
    assert a.key == wl(spec({"thaw.dev/workload": "web"})).key
    assert a.key.startswith("ctr-a.web.") and (a.tenant, a.image) == (TENANT, IMAGE)
    assert a.key != wl(spec({"thaw.dev/workload": "web"}, args=("/app/other",))).key
    assert a.key != wl(spec({"thaw.dev/workload": "web", "thaw.dev/tenant": "ctr-a.t2"})).key
    gpu = [{"path": "/dev/nvidia0", "type": "c"}]
    assert a.key != wl(spec({"thaw.dev/workload": "web"}, devices=gpu)).key


def test_key_covers_what_the_runtime_says_not_what_the_spec_says():
    same = {"thaw.dev/workload": "web"}
    a = wl(spec(same))
    assert a.key != wl(spec(same), tenant="ctr-b").key                    # another tenant, same annotations
    assert a.key != wl(spec(same), image="sha256:" + "2" * 64).key       # another image (or a re-pushed tag)
    # Image-name annotations a workload can write change nothing any more.
    named = {**same, "io.kubernetes.cri.image-name": "other:1", "io.containerd.image.name": "other:1"}
    assert wl(spec(named)).key == a.key


def test_tenant_annotation_narrows_never_widens_or_switches():
    base = {"thaw.dev/workload": "web"}
    assert wl(spec({**base, "thaw.dev/tenant": TENANT})).key == wl(spec(base)).key   # repeating it is a no-op
    sub = wl(spec({**base, "thaw.dev/tenant": "ctr-a.batch"}))
    assert sub.tenant == "ctr-a.batch" and sub.key.startswith("ctr-a.batch.web.")
    for forged in ("ctr-b", "default", "ctr-b.batch", "ctr-ab", "ctr-a.", "ctr-a.x.y", "ctr-a.UPPER", ""):
        with pytest.raises(IdentityError) as e:
            wl(spec({**base, "thaw.dev/tenant": forged}))
        assert e.value.code == "tenant-refused", forged


def test_runtime_facts_are_validated():
    with pytest.raises(UserError):
        wl(spec({"thaw.dev/workload": "web"}), image="latest")
    with pytest.raises(UserError):
        wl(spec({"thaw.dev/workload": "web"}), tenant="Not.A.Tenant")


def test_longest_key_fits_the_manifest_limit():
    from control.images.manifest import validate_key
    w = wl(spec({"thaw.dev/workload": "w" * 200, "thaw.dev/tenant": "t" * 48 + "." + "s" * 16}), tenant="t" * 48)
    assert validate_key(w.key) == w.key and len(w.key) <= 128


def test_env_counts_only_when_listed():
    base = {"thaw.dev/workload": "web"}
    k1 = wl(spec(base, env={"MODEL": "a", "NOISE": "1"})).key
    k2 = wl(spec(base, env={"MODEL": "b", "NOISE": "2"})).key
    assert k1 == k2
    listed = {**base, "thaw.dev/key-env": "MODEL"}
    assert wl(spec(listed, env={"MODEL": "a"})).key != wl(spec(listed, env={"MODEL": "b"})).key


def test_probes_and_their_defaults():
    # No readiness probe: never checkpointed automatically; a restore checks it runs.
    w = wl(spec({"thaw.dev/workload": "web"}))
    assert (w.ready, w.health) == (None, probe.RunningProbe())
    w = wl(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "file:/tmp/ready"}))
    assert w.health == w.ready == probe.FileProbe("/tmp/ready")
    # The one grammar: http/gpu/tcp probes work in annotations too.
    w = wl(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "http:8000/health"}))
    assert w.health == w.ready == probe.HttpProbe(8000, "/health")
    w = wl(spec({"thaw.dev/workload": "web", "thaw.dev/ready": "delay:5"}))
    assert (w.ready, w.health) == (probe.DelayProbe(5.0), probe.RunningProbe())
    w = wl(spec({"thaw.dev/workload": "web", "thaw.dev/health": "exec:true"}))
    assert w.health == probe.ExecProbe(("true",))


@pytest.mark.parametrize("ann, field", [
    ({"thaw.dev/workload": "bad name!"}, "thaw.dev/workload"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "http:/x"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "ftp:21"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/ready": "delay:soon"}, "thaw.dev/ready"),
    ({"thaw.dev/workload": "w", "thaw.dev/health": "file:relative"}, "thaw.dev/health"),
])
def test_bad_annotations_name_the_field(ann, field):
    with pytest.raises(UserError) as e:
        wl(spec(ann))
    assert e.value.fields["field"] == field


def test_thaw_annotations_are_bounded():
    """thawd reads any container's annotations: a value over the bound is refused before parsing."""
    from control.lifecycle.workload import MAX_ANNOTATION_BYTES
    spec = specmod.command_spec(["/app"], rootfs="r", annotations={
        "thaw.dev/workload": "w", "thaw.dev/ready": "exec:" + "x" * MAX_ANNOTATION_BYTES})
    with pytest.raises(UserError, match="thaw.dev/ready is .* bytes, more than"):
        workload.from_spec(spec, TENANT, IMAGE)
    spec["annotations"]["thaw.dev/ready"] = "file:/tmp/ready"
    spec["annotations"]["other.example/huge"] = "y" * (2 * MAX_ANNOTATION_BYTES)   # not thaw's: the file bound covers it
    assert workload.from_spec(spec, TENANT, IMAGE).ready is not None
