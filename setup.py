"""The package layout: the repository's top-level folders are subpackages of the one import name ``inferwatch``.

pyproject.toml holds everything else about the build; this file only computes the package list, which
pyproject.toml cannot (its ``packages.find`` has no way to rename a folder). ``scripts/package-tree`` reads
``FOLDERS`` to lay the same mapping out as a directory of symlinks for mypy and import-linter, which find
modules on disk and do not see the mapping an editable install puts in place.
"""

from setuptools import find_packages, setup

ROOT_PACKAGE = "inferwatch"
# folder in the repository -> its import name
FOLDERS = {
    "inferwatch": "inferwatch",
    "agent": "inferwatch.agent",
    "exporters": "inferwatch.exporters",
    "simulator": "inferwatch.simulator",
    "dashboards": "inferwatch.dashboards",
}


def layout() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for folder, name in FOLDERS.items():
        package_dir[name] = folder
        packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return packages, package_dir


if __name__ == "__main__":
    packages, package_dir = layout()
    setup(packages=packages, package_dir=package_dir)
