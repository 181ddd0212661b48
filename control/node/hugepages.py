"""Host huge pages for runsc's memory file (node.huge_pages): what provision writes
into /sys/kernel/mm/transparent_hugepage and the boot-time tmpfiles line that keeps it."""

from __future__ import annotations

from pathlib import Path

from control.config import Settings
from control.node.steps import NONE, SKIP, UPDATE, Layout, Plan, Skip, Step, WriteFile

# Host shmem THP (node.huge_pages). runsc backs a sandbox's memory file with huge
# pages only when shmem_enabled is "advise" and defrag one of THP_DEFRAG_OK
# (runsc/boot/loader.go createMemoryFile: the others may direct-compact where
# native anonymous memory would not). Not "always": it halves nvproxy's pageable
# copies (gVisor #12804). Measured on the H200: docs/notes/2026-11-29-gpu-restore-journal.md
# "Measured (H200, 2026-12-01, medians of 3)".
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")
THP_SHMEM = "advise"
THP_DEFRAG_OK = ("always", "defer", "never")
THP_DEFRAG = "defer"          # wakes kcompactd instead of compacting in the fault
THP_TMPFILES = Path("/etc/tmpfiles.d/thaw-huge-pages.conf")   # systemd-tmpfiles writes sysfs at boot
THP_NAMES = ("shmem_enabled", "defrag")


def thp_selected(text: str) -> str:
    """The selected word of a THP sysfs file ("always [madvise] never" -> "madvise");
    a file holding one bare word (a tree made for tests) is that word."""
    words = text.split()
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else (words[0] if len(words) == 1 else "")


def thp_read(d: Path) -> dict[str, str]:
    """The selected value of each of the host's THP settings in `d` (THP_DIR, or its
    place in a tree); OSError when they cannot be read."""
    return {n: thp_selected((d / n).read_text()) for n in THP_NAMES}


def thp_write(d: Path, values: dict[str, str]) -> None:
    """Set the host's THP settings in `d` (thp_read's twin); sysfs: one write each,
    no temp file and rename."""
    for n, v in values.items():
        (d / n).write_text(v)


def huge_pages_off(thp_dir: Path = THP_DIR) -> str:
    """Why runsc backs a sandbox's memory with 4 KiB pages on this host, in
    words; "" when the host settings let it use huge pages (what HostHugePages sets)."""
    try:
        have = thp_read(thp_dir)
    except OSError as e:
        return f"cannot read {thp_dir} ({e.strerror or e})"
    bad = [f"{n} is {have[n] or '?'}" for n, ok in (("shmem_enabled", have["shmem_enabled"] == THP_SHMEM),
                                                    ("defrag", have["defrag"] in THP_DEFRAG_OK)) if not ok]
    return ", ".join(bad)


# The reads thaw-gofer offers the sentry for a complete image (cache.verify = read,
# control/images/served.py): the shape ci/patch-runsc-loader.py gives runsc's own
# pages-file loader, which such a restore bypasses (runsc/boot/controller.go
# getRestoreReadersForCheckpointGofer takes the gofer's MaxParallel and MaxReadBytes).
# Twins: ci/build-go.sh RESTORE_HUGE_READERS and RESTORE_HUGE_READ_KIB. On the H200 the
# gofer's 32 reads of 256 KiB made a ~3B restore 1.33x slower than the loader's 12 of
# 4 MiB on huge pages (docs/benchmarks.md, 2026-12-03).
GOFER_HUGE_READERS = 12
GOFER_HUGE_READ_BYTES = 4096 << 10
# Elsewhere: 32 reads of runsc's 256 KiB, as a streamed restore (control/images/stream.py);
# measured against runsc's own reads on the 2-core VM: 0.80x the first answer.
GOFER_SMALL_READERS = 32
GOFER_SMALL_READ_BYTES = 256 << 10


def runsc_huge_pages(thp: dict[str, str]) -> bool:
    """Whether runsc (--app-huge-pages, its default) backs a sandbox's memory file with
    huge pages under these host THP settings (runsc/boot/loader.go createMemoryFile)."""
    shmem, defrag = thp.get("shmem_enabled", ""), thp.get("defrag", "")
    return shmem in ("always", "within_size", "force") or (shmem == "advise" and defrag in THP_DEFRAG_OK)


def host_huge_pages(thp_dir: Path = THP_DIR) -> bool:
    """runsc_huge_pages of this host's settings; False when they cannot be read."""
    try:
        return runsc_huge_pages(thp_read(thp_dir))
    except OSError:
        return False


def gofer_read_shape(huge: bool, cpus: int) -> tuple[int, int]:
    """(reads in flight, bytes per read) thaw-gofer offers for a complete image."""
    if huge and cpus >= GOFER_HUGE_READERS:
        return GOFER_HUGE_READERS, GOFER_HUGE_READ_BYTES
    return GOFER_SMALL_READERS, GOFER_SMALL_READ_BYTES


def thp_wanted(layout: Layout) -> dict[str, str]:
    """The values provision sets: shmem_enabled advise; the host's defrag where runsc
    accepts it, else defer."""
    try:
        defrag = thp_selected(layout.host(THP_DIR / "defrag").read_text())
    except OSError:
        defrag = ""
    return {"shmem_enabled": THP_SHMEM, "defrag": defrag if defrag in THP_DEFRAG_OK else THP_DEFRAG}


def thp_tmpfiles(values: dict[str, str]) -> str:
    return ("# Written by `thaw provision` (node.huge_pages): runsc backs a sandbox's memory with huge\n"
            "# pages only with these host settings (docs/provision.md).\n"
            + "".join(f"w {THP_DIR / name} - - - - {value}\n" for name, value in values.items()))


class HostHugePages(Step):
    """The host's shmem THP settings, now (sysfs); THP_TMPFILES keeps them across reboots."""

    name = "host huge pages"

    def __init__(self, layout: Layout, values: dict[str, str]) -> None:
        self.layout, self.values = layout, values
        self.dir = layout.host(THP_DIR)

    def plan(self, earlier: list[Plan]) -> Plan:
        t = str(self.dir)
        try:
            have = thp_read(self.dir)
        except OSError as e:
            return Plan(self.name, t, SKIP, f"cannot read the host's THP settings ({e}): runsc backs "
                        "sandboxes' memory with 4 KiB pages (slower GPU restores, docs/gpu.md)", warning=True)
        if have["shmem_enabled"] == THP_SHMEM and have["defrag"] in THP_DEFRAG_OK:
            return Plan(self.name, t, NONE, f"shmem_enabled {have['shmem_enabled']}, defrag {have['defrag']}")
        return Plan(self.name, t, UPDATE, ", ".join(f"{n} {have[n] or '?'} -> {v}" for n, v in self.values.items()
                                                   if have[n] != v))

    def apply(self, plan: Plan) -> None:
        # A value runsc takes is left alone.
        thp_write(self.dir, {n: v for n, v in self.values.items() if thp_selected((self.dir / n).read_text()) != v})


def huge_pages_steps(settings: Settings, lay: Layout, gpu: bool) -> list[Step]:
    if settings.huge_pages == "no" or (settings.huge_pages == "auto" and not gpu):
        why = ("node.huge_pages = no: the host's settings are left as they are" if settings.huge_pages == "no"
               else "CPU node (node.huge_pages = auto sets them on GPU nodes)")
        return [Skip("host huge pages", str(lay.host(THP_DIR)), why, warning=False),
                Skip("huge pages at boot", str(lay.host(THP_TMPFILES)), why, warning=False)]
    values = thp_wanted(lay)
    return [HostHugePages(lay, values),
            WriteFile("huge pages at boot", lay, THP_TMPFILES, 0o644, content=thp_tmpfiles(values))]
