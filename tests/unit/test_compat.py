import dataclasses

import pytest

from control.node import compat
from control.node.compat import CompatTuple, check
from control.config import load
from control.errors import ManifestError
from nvproxy import gpu

from .fakes import TUPLE


def test_identical_tuples_match():
    assert check(TUPLE, TUPLE) == []


def test_cpu_feature_superset_passes_subset_fails_naming_missing():
    more = dataclasses.replace(TUPLE, cpu_features=TUPLE.cpu_features + ("avx512f",))
    assert check(TUPLE, more) == []
    bad = check(more, TUPLE)
    assert [m.field for m in bad] == ["cpu_features"]
    assert "avx512f" in str(bad[0])


def test_every_other_field_must_be_equal_and_is_explained():
    node = dataclasses.replace(TUPLE, runsc_version="other", gpu_count=1, gpu_product="NVIDIA H200",
                               driver_version="580.159.04", machine_type="big")
    fields = {m.field: str(m) for m in check(TUPLE, node)}
    assert set(fields) == {"runsc_version", "gpu_count", "gpu_product", "driver_version", "machine_type"}
    assert "image has 'test', node has 'big'" in fields["machine_type"]


def test_hash_is_stable_and_covers_every_field():
    h = TUPLE.hash()
    assert h == CompatTuple.from_dict(TUPLE.to_dict()).hash()
    assert len(h) == 64
    for f in dataclasses.fields(CompatTuple):
        v = getattr(TUPLE, f.name)
        changed = (v + ("x",)) if isinstance(v, tuple) else (v + 1 if isinstance(v, int) else v + "x")
        assert dataclasses.replace(TUPLE, **{f.name: changed}).hash() != h, f.name


def test_from_dict_names_the_bad_field():
    d = TUPLE.to_dict()
    d["gpu_count"] = -1
    with pytest.raises(ManifestError) as e:
        CompatTuple.from_dict(d)
    assert e.value.field == "tuple.gpu_count"
    d = TUPLE.to_dict()
    del d["arch"]
    with pytest.raises(ManifestError, match="tuple.arch"):
        CompatTuple.from_dict(d)
    d = TUPLE.to_dict() | {"extra": 1}
    with pytest.raises(ManifestError, match="tuple.extra"):
        CompatTuple.from_dict(d)


class FakeRunsc:
    def version(self):
        return "thaw-gvisor-x"

    def cpu_features(self):
        return ["sse2", "avx2", "sse2"]


def _gpus(*products: str) -> gpu.NodeGpus:
    return gpu.NodeGpus("580.159.04", "13.0", tuple(
        gpu.Gpu(index=i, product=p, uuid=f"GPU-{i}", minor=i, memory_bytes=143771 << 20,
                pci_bus_id=f"0000:0{i}:00.0") for i, p in enumerate(products)), source="nvml")


def test_node_tuple_without_gpu_is_valid():
    s = load(environ={}, overrides={"node.machine_type": "m1"})
    t = compat.node_tuple(s, runsc=FakeRunsc(), gpus=gpu.NodeGpus(), arch="x86_64")
    assert t.gpu_count == 0 and t.gpu_product == "" and t.driver_version == ""
    assert t.cpu_features == ("avx2", "sse2")
    assert t.machine_type == "m1" and t.runsc_version == "thaw-gvisor-x" and t.platform == "systrap"


def test_node_tuple_with_gpu():
    s = load(environ={})
    t = compat.node_tuple(s, runsc=FakeRunsc(), gpus=_gpus(*["NVIDIA H200"] * 8), arch="x86_64")
    assert (t.gpu_product, t.gpu_count, t.driver_version, t.cuda_driver_version) == \
        ("NVIDIA H200", 8, "580.159.04", "13.0")


def test_gpu_product_is_the_sorted_distinct_names_joined():
    # The one rule (compat.py docstring, docs/gpu.md): not GPU 0's name, not
    # dependent on enumeration order.
    s = load(environ={})
    a = compat.node_tuple(s, runsc=FakeRunsc(), gpus=_gpus("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"),
                          arch="x86_64")
    b = compat.node_tuple(s, runsc=FakeRunsc(), gpus=_gpus("NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA H200"),
                          arch="x86_64")
    assert a.gpu_product == "NVIDIA A100-SXM4-80GB,NVIDIA H200" and a.gpu_count == 3
    assert a.hash() == b.hash()


def test_node_tuple_reads_gpus_through_nvproxy_gpu_probe(monkeypatch):
    s = load(environ={})
    monkeypatch.setattr(gpu, "probe", lambda: _gpus("NVIDIA H200", "NVIDIA H200"))
    t = compat.node_tuple(s, runsc=FakeRunsc(), arch="x86_64")
    assert (t.gpu_product, t.gpu_count, t.driver_version) == ("NVIDIA H200", 2, "580.159.04")
    monkeypatch.setattr(gpu, "probe", lambda: gpu.NodeGpus())
    assert compat.node_tuple(s, runsc=FakeRunsc(), arch="x86_64").gpu_count == 0


def test_an_image_directory_is_checked_against_the_node_by_the_tuple_it_records():
    """Issue 30: thaw.json records the tuple; restore refuses a mismatch naming the field
    (exit 3); an image of an older thaw is judged by its runsc version and platform."""
    from control.errors import ImageError, TupleMismatch, exit_code
    other = dataclasses.replace(TUPLE, cpu_features=TUPLE.cpu_features + ("avx1024",), machine_type="x")
    compat.check_image({"tuple": TUPLE.to_dict()}, "/img", TUPLE)
    with pytest.raises(TupleMismatch) as e:
        compat.check_image({"tuple": other.to_dict()}, "/img", TUPLE)
    assert exit_code(e.value) == 3 and "cpu_features" in str(e.value) and "avx1024" in str(e.value)
    assert "machine_type: image has 'x'" in str(e.value) and "/img" in str(e.value)
    compat.check_image({"runsc_version": TUPLE.runsc_version, "platform": TUPLE.platform}, "/img", TUPLE)
    with pytest.raises(TupleMismatch, match="runsc_version: image has 'other'"):
        compat.check_image({"runsc_version": "other", "platform": TUPLE.platform}, "/img", TUPLE)
    with pytest.raises(ImageError, match="thaw.json field tuple.gpu_count"):
        compat.check_image({"tuple": {**TUPLE.to_dict(), "gpu_count": -1}}, "/img", TUPLE)
    assert compat.image_tuple({}, "/img") is None and compat.image_tuple({"tuple": TUPLE.to_dict()}, "/i") == TUPLE
