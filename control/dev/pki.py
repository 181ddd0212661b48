"""The dev cluster's certificates and kubeconfigs (control/dev/cluster.py), made
with the openssl CLI: one CA, a serving certificate for the API server and
one per kubelet, client certificates for every component and the admin, and
the service-account signing key. What kubeadm would make, minus everything
a throwaway cluster on one machine does not need (no front-proxy CA, no etcd
TLS: etcd listens on loopback only). Keys are EC P-256: quick to make, and
accepted by every component (the API server signs service-account tokens
with ES256 from an EC key).
"""
from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from control.errors import PreconditionError, ThawError

DAYS = 30   # a dev cluster is rebuilt long before


def _openssl(*args: str, stdin: str | None = None) -> str:
    try:
        p = subprocess.run(["openssl", *args], capture_output=True, text=True, input=stdin, timeout=30)
    except FileNotFoundError:
        raise PreconditionError("the openssl command is not installed (the dev cluster's certificates need it)") \
            from None
    if p.returncode != 0:
        raise ThawError(f"openssl {args[0]} failed (exit {p.returncode}): {p.stderr.strip()[-500:]}",
                        returncode=p.returncode)
    return p.stdout


def _key(path: Path) -> None:
    """An EC P-256 private key (PKCS#8 PEM), born 0600."""
    pem = _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pem)


@dataclass(frozen=True)
class Cert:
    crt: Path
    key: Path


class Pki:
    """A CA under `dir` and the certificates it signs."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.ca = Cert(dir / "ca.crt", dir / "ca.key")

    def create_ca(self, name: str) -> Cert:
        self.dir.mkdir(parents=True, exist_ok=True)
        _key(self.ca.key)
        _openssl("req", "-x509", "-new", "-key", str(self.ca.key), "-subj", f"/CN={name}", "-days", str(DAYS),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
                 "-out", str(self.ca.crt))
        return self.ca

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), *, client: bool = False,
              server: bool = False, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> Cert:
        """A certificate for `cn` in groups `orgs` (the API server reads a client
        certificate's CN as the user and its O as groups)."""
        cert = Cert(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        _key(cert.key)
        subj = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        usage = ",".join(u for u, on in (("clientAuth", client), ("serverAuth", server)) if on)
        ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
               f"extendedKeyUsage={usage}"]
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        extfile = self.dir / f"{name}.ext"
        extfile.write_text("\n".join(ext) + "\n")
        csr = _openssl("req", "-new", "-key", str(cert.key), "-subj", subj)
        _openssl("x509", "-req", "-CA", str(self.ca.crt), "-CAkey", str(self.ca.key), "-CAcreateserial",
                 "-days", str(DAYS), "-extfile", str(extfile), "-out", str(cert.crt), stdin=csr)
        extfile.unlink()
        return cert

    def service_account_keys(self) -> tuple[Path, Path]:
        """The key the API server signs service-account tokens with, and its public half."""
        key, pub = self.dir / "sa.key", self.dir / "sa.pub"
        _key(key)
        pub.write_text(_openssl("pkey", "-in", str(key), "-pubout"))
        return key, pub


def kubeconfig(path: Path, server: str, ca: Path, cert: Cert, user: str) -> Path:
    """A kubeconfig with one cluster, one user (a client certificate), one context;
    certificates inline, so the file is all a client needs. Born 0600: it holds a key."""
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()
    text = (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: thaw\n  cluster:\n    server: {server}\n    certificate-authority-data: {b64(ca)}\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate-data: {b64(cert.crt)}\n"
        f"    client-key-data: {b64(cert.key)}\n"
        f"contexts:\n- name: thaw\n  context:\n    cluster: thaw\n    user: {user}\n"
        "current-context: thaw\n")
    tmp = path.with_name(path.name + ".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)
    return path
