"""Packages are found, not listed: every folder with an __init__.py under the top-level
folders (`ROOTS`) becomes `corps.<folder>...`, so a new subpackage cannot be left
out of the wheel (tests/test_wheel.py builds one and checks)."""

from setuptools import find_packages, setup

#: top-level folders, each the import package corps.<folder> (see DESIGN.md's layout)
ROOTS = ("engine", "cache", "agents", "patterns", "serve", "view", "bench", "cli")


def corps_packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for root in ROOTS:
        packages.append(f"corps.{root}")
        packages += [f"corps.{root}.{sub}" for sub in find_packages(root)]
        package_dir[f"corps.{root}"] = root
    return packages, package_dir


packages, package_dir = corps_packages()
setup(packages=packages, package_dir=package_dir)
