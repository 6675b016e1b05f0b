"""The supported vLLM releases (patches/pins.toml), and the two eras of XPU
support a release belongs to."""

import re
import tomllib
from dataclasses import dataclass, field
from functools import cache

from xpufakes.common import paths
from xpufakes.common.errors import Refusal

# The eras: vLLM 0.10.2 - 0.15.x call IPEX's torch_ipex ops; 0.16.0 on call
# vllm-xpu-kernels' _xpu_C ops. A series is named <era>-<its first release>.
IPEX, KERNELS = "ipex", "kernels"
ERAS = (IPEX, KERNELS)
FIRST_PATCHED = (0, 10, 2)  # the first release with compilation on on XPU
# (older ones: compiled.py)
FIRST_KERNELS = (0, 16)


def version_tuple(text: str) -> tuple[int, ...]:
    """(0, 33, 0) for "0.33.0"."""
    return tuple(int(p) for p in text.split("."))


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(.*)$", re.S)


def split_version(text: str) -> tuple[tuple[int, ...], str] | None:
    """((0, 10, 3), ".dev0+g01efc7ef7") for "0.10.3.dev0+g01efc7ef7" (a
    leading "v" allowed), or None if it does not start with a release."""
    match = _VERSION.match(text)
    return (version_tuple(match.group(1)), match.group(2)) if match else None


def era_of(version: tuple[int, ...]) -> str | None:
    """The era of a release: IPEX (0.10.2-0.15.x), KERNELS (0.16.0+), or
    None (older: compiled.py says whether it is affected)."""
    if version < FIRST_PATCHED:
        return None
    return IPEX if version < FIRST_KERNELS else KERNELS


def series_name(era: str, first_release: str) -> str:
    return f"{era}-{first_release}"


@dataclass(frozen=True)
class Pin:
    version: str
    sdist_sha256: str  # of vllm-<version>.tar.gz on the package index ("": none)
    series: str  # a directory under patches/, <era>-<first release>
    kernels: str  # the XPU kernel package the release pins (requirements/xpu.txt)
    files: dict[str, str] = field(default_factory=dict)  # path -> pristine sha256
    # A release published only as a wheel (0.15.0, 0.15.1): its file name on
    # the package index, its sha256 there, and the sha256 of its RECORD,
    # which holds every member's (wheel.py)
    wheel: str = ""
    wheel_sha256: str = ""
    record_sha256: str = ""

    @property
    def verified_by(self) -> str:
        """The pinned sha256 its pristine tree is checked against."""
        return self.record_sha256 if self.wheel else self.sdist_sha256

    @property
    def era(self) -> str:
        """IPEX or KERNELS: the era its series was made for."""
        return self.series.split("-", 1)[0]

    @property
    def release(self) -> tuple[int, ...]:
        return version_tuple(self.version)


@dataclass(frozen=True)
class Pins:
    releases: dict[str, Pin]

    def get(self, version: str) -> Pin:
        pin = self.releases.get(version)
        if pin is not None:
            return pin
        raise Refusal(
            f"vLLM {version} is not a supported release; supported: "
            + " ".join(self.releases)
        )

    def ordered(self, era: str | None = None) -> list[Pin]:
        """The pinned releases, oldest first (only those of `era`)."""
        found = sorted(self.releases.values(), key=lambda p: p.release)
        return [p for p in found if era is None or p.era == era]

    def newest(self) -> Pin:
        """The newest pinned release: no test or doc names it by hand
        (tests/test_release_literals.py)."""
        return self.ordered()[-1]

    def next_release(self) -> str:
        """A plain release newer than every pin: the next minor release."""
        major, minor = self.newest().release[:2]
        return f"{major}.{minor + 1}.0"

    def newest_kernels(self) -> str:
        """The release of the XPU kernels the newest kernels-era pin pins
        (the number of "vllm-xpu-kernels X.Y.Z"): the reference kernels'
        default (`make ops` writes it there)."""
        return self.ordered(KERNELS)[-1].kernels.split()[-1]


@cache
def load() -> Pins:
    data = tomllib.loads(paths.PINS.read_text())
    releases = {
        version: Pin(
            version=version,
            sdist_sha256=entry.get("sdist_sha256", ""),
            series=entry["series"],
            kernels=entry.get("kernels", ""),
            files=dict(entry.get("files", {})),
            wheel=entry.get("wheel", ""),
            wheel_sha256=entry.get("wheel_sha256", ""),
            record_sha256=entry.get("record_sha256", ""),
        )
        for version, entry in data["releases"].items()
    }
    return Pins(releases)
