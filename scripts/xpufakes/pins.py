"""The supported vLLM releases (patches/pins.toml)."""

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
from dataclasses import dataclass, field
from functools import cache

from . import paths
from .errors import Refusal


@dataclass(frozen=True)
class Pin:
    version: str
    sdist_sha256: str  # of vllm-<version>.tar.gz on the package index
    series: str  # a directory under patches/
    kernels: str  # the XPU kernel package the release pins (informational)
    files: dict[str, str] = field(default_factory=dict)  # path -> pristine sha256


@dataclass(frozen=True)
class Pins:
    releases: dict[str, Pin]
    not_needed: dict[str, str]  # release -> why it needs no patch

    def get(self, version: str) -> Pin:
        pin = self.releases.get(version)
        if pin is not None:
            return pin
        if version in self.not_needed:
            raise Refusal(f"vLLM {version} needs no patch: {self.not_needed[version]}")
        raise Refusal(
            f"vLLM {version} is not a supported release; supported: "
            + " ".join(self.releases)
        )


@cache
def load() -> Pins:
    data = tomllib.loads(paths.PINS.read_text())
    releases = {
        version: Pin(
            version=version,
            sdist_sha256=entry["sdist_sha256"],
            series=entry["series"],
            kernels=entry.get("kernels", ""),
            files=dict(entry.get("files", {})),
        )
        for version, entry in data["releases"].items()
    }
    return Pins(releases, dict(data.get("not_needed", {})))
