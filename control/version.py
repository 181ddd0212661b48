"""thaw's version: the one place it is written.

Everything else derives from it: the wheel's metadata (pyproject.toml reads
it, `[tool.setuptools.dynamic]`), `thaw --version`, thawd's Health answer,
the manifests' `creator.thaw`, the Go commands' stamp (ci/build-go.sh passes
it as -X thaw.dev/thaw/go/internal/version.Version), the DaemonSet image's tag
(ci/build-image.sh), the Kubernetes manifests and deploy/Containerfile (their
copies are checked by tests/unit/test_version.py) and `make release`'s
dist/thaw-<version>/ (ci/release.sh).

`python3 control/version.py` prints it (the shell scripts ask it that way, so
they need neither an installed thaw nor its dependencies).
"""

VERSION = "0.1.0"

# The PyPI distribution name: `thaw` is another project's (a 2020 package), and
# `thaw-vllm` / `thaw-native` are another GPU snapshot product's. `runsc-thaw` is
# free and is already this project's word for itself on a node (the containerd
# runtime handler and Kubernetes RuntimeClass `runsc-thaw`). The command stays
# `thaw`. Twin: pyproject.toml [project] name.
DISTRIBUTION = "runsc-thaw"

# The DaemonSet image, tagged with VERSION (ci/build-image.sh, deploy/kubernetes/40-daemonset.yaml).
IMAGE_REPOSITORY = "ghcr.io/thaw-dev/thaw"


def image_ref() -> str:
    """The DaemonSet image of this version."""
    return f"{IMAGE_REPOSITORY}:{VERSION}"


if __name__ == "__main__":
    print(VERSION)
