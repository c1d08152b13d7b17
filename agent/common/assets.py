"""The files inferwatch ships besides its code, found at run time through ``importlib.resources``.

=============  ===========================================  ===================================
asset          single source in the repository              written by ``inferwatch assets export``
=============  ===========================================  ===================================
alert rules    ``alerts/*.rules.yml``                       ``rules/<file>.rules.yml``
Alertmanager   ``alerts/alertmanager.yml``                  ``alertmanager.yml``
SLO spec       ``alerts/slo.yml``                           ``slo.yml``
dashboards     ``dashboards/json/<uid>.json``               ``dashboards/<uid>.json``
runbooks       ``runbooks/<AlertName>.md``                  ``runbooks/<AlertName>.md``
=============  ===========================================  ===================================

How the package reaches them: ``agent/_assets/alerts`` and ``agent/_assets/runbooks`` are symbolic links to
the top-level ``alerts/`` and ``runbooks/`` (no copy is committed), and pyproject.toml declares their files
package data of ``inferwatch.agent``; setuptools follows the links, so the sdist carries real files at
``agent/_assets/...`` and the wheel at ``inferwatch/agent/_assets/...``. The dashboards are package data of
``inferwatch.dashboards``, whose ``json/`` holds them already. Every reader (the runbook server, ``grafana push``,
``assets export``) goes through this module, so one code path serves a checkout (editable install) and a wheel.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from inferwatch.agent.errors import AssetError

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable

ASSETS_PACKAGE = "inferwatch.agent"
ASSETS_SUBDIR = "_assets"  # agent/_assets/{alerts,runbooks}: symlinks in the repository, real dirs in a wheel
DASHBOARDS_PACKAGE = "inferwatch.dashboards"
RULES_SUFFIX = ".rules.yml"
ALERTMANAGER_FILE = "alertmanager.yml"
SLO_SPEC_FILE = "slo.yml"


@dataclass(frozen=True, slots=True)
class Asset:
    """One shipped file: ``path`` is where ``export`` writes it (POSIX, relative), ``source`` where it is read."""

    path: str
    source: Traversable

    def read_bytes(self) -> bytes:
        try:
            return self.source.read_bytes()
        except OSError as exc:
            raise AssetError(f"cannot read the shipped asset {self.path}: {exc}") from exc


def alerts_dir() -> Traversable:
    """The alert rule files, the Alertmanager config and the SLO spec (``alerts/`` in the repository)."""
    return files(ASSETS_PACKAGE) / ASSETS_SUBDIR / "alerts"


def runbooks_dir() -> Traversable:
    """One Markdown runbook per alert, named after it (``runbooks/`` in the repository)."""
    return files(ASSETS_PACKAGE) / ASSETS_SUBDIR / "runbooks"


def dashboards_dir() -> Traversable:
    """The generated Grafana dashboards, one JSON file per uid (``dashboards/json/`` in the repository)."""
    return files(DASHBOARDS_PACKAGE) / "json"


def _listing(directory: Traversable, suffix: str) -> list[Traversable]:
    """The files in ``directory`` whose name ends in ``suffix``, by name; AssetError when there are none."""
    found = (
        sorted((p for p in directory.iterdir() if p.name.endswith(suffix) and p.is_file()), key=lambda p: p.name)
        if directory.is_dir()
        else []
    )
    if not found:
        raise AssetError(f"no *{suffix} in {directory}: the inferwatch installation is incomplete, reinstall it")
    return found


def _file(directory: Traversable, name: str) -> Traversable:
    path = directory / name
    if not path.is_file():
        raise AssetError(f"{name} not found in {directory}: the inferwatch installation is incomplete, reinstall it")
    return path


def rule_files() -> list[Traversable]:
    """The Prometheus rule files (alerting and recording rules), by file name."""
    return _listing(alerts_dir(), RULES_SUFFIX)


def alertmanager_config() -> Traversable:
    return _file(alerts_dir(), ALERTMANAGER_FILE)


def slo_spec() -> Traversable:
    """The SLO spec ``python -m inferwatch.agent.alerts.slo`` generates ``slo.rules.yml`` from."""
    return _file(alerts_dir(), SLO_SPEC_FILE)


def catalog() -> list[Asset]:
    """Every shipped asset, in the layout ``export`` writes (rules/, alertmanager.yml, slo.yml, dashboards/, ...)."""
    out = [Asset(f"rules/{p.name}", p) for p in rule_files()]
    out.append(Asset(ALERTMANAGER_FILE, alertmanager_config()))
    out.append(Asset(SLO_SPEC_FILE, slo_spec()))
    out += [Asset(f"dashboards/{p.name}", p) for p in _listing(dashboards_dir(), ".json")]
    out += [Asset(f"runbooks/{p.name}", p) for p in _listing(runbooks_dir(), ".md")]
    return out


def find(name: str) -> Asset:
    """The asset at export path ``name`` (``rules/slo.rules.yml``), or the only one with that file name or stem
    (``slo.rules.yml``, ``AgentDown``, ``inferwatch-engine``)."""
    assets = catalog()
    for match in (
        lambda a: a.path == name,
        lambda a: a.path.rsplit("/", 1)[-1] == name,
        lambda a: a.path.rsplit("/", 1)[-1].split(".", 1)[0] == name,
    ):
        hits = [a for a in assets if match(a)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise AssetError(f"{name!r} is ambiguous: {', '.join(a.path for a in hits)}")
    raise AssetError(f"no shipped asset named {name!r} (inferwatch assets list shows them)")


def export(directory: Path, overwrite: bool = False) -> list[Path]:
    """Write every asset under ``directory`` (created) in the ``catalog()`` layout; return the files written.

    Files already there are left alone and AssetError names them, unless ``overwrite``; nothing is deleted.
    """
    assets = catalog()
    targets = [(directory / a.path, a) for a in assets]
    if not overwrite:
        existing = [str(t) for t, _ in targets if t.exists()]
        if existing:
            more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
            raise AssetError(f"would overwrite {', '.join(existing[:3])}{more} (pass --force to replace them)")
    written = []
    for target, asset in targets:
        data = asset.read_bytes()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:
            raise AssetError(f"cannot write {target}: {exc}") from exc
        written.append(target)
    return written
