"""The package layout: the repository's top-level folders are subpackages of the one import name ``inferwatch``.

pyproject.toml holds everything else about the build; this file only computes the package list, which
pyproject.toml cannot (its ``packages.find`` has no way to rename a folder). In the repository the root folder
``inferwatch/`` also holds one symlink per subpackage (``inferwatch/agent -> ../agent``, ...), so a checkout
imports the installed names too and tools that find modules by walking folders (mypy, import-linter) see them;
the build never walks those links: the root package is ``inferwatch/__init__.py`` alone, each subpackage comes
from its own folder.

It also declares the one C extension, ``inferwatch.agent.node.engine._fastparse`` (the exposition reader's bulk
steps, agent/node/engine/bulkparse.py): optional, so where no C compiler or Python headers are there the build
says so and goes on, and the package reads expositions with the pure-Python steps. With it the wheel is
specific to the Python version and platform it was built on (``inferwatch-0.1.0-cp311-cp311-linux_x86_64.whl``).
"""

from setuptools import Extension, find_packages, setup

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
        below = [] if name == ROOT_PACKAGE else find_packages(folder)  # the root's subfolders are the links
        packages += [name, *(f"{name}.{sub}" for sub in below)]
    return packages, package_dir


if __name__ == "__main__":
    packages, package_dir = layout()
    fastparse = Extension(
        "inferwatch.agent.node.engine._fastparse",
        sources=["agent/node/engine/_fastparse.c"],
        optional=True,  # no compiler or headers: the pure-Python steps (bulkparse.COMPILED is False)
    )
    setup(packages=packages, package_dir=package_dir, ext_modules=[fastparse])
