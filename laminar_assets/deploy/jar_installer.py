"""Install the pinned JVM libraries (engine/spark/jars.py) from Maven Central, once.

Usage: python -m laminar_assets.deploy.jar_installer [GROUP ...]   (default: s3 delta)

A file already there with the pinned size and SHA-1 is kept; a download goes to a temporary
file, is checked, then moved into place, so an interrupted install leaves no half file behind.
A wrong checksum, an unreachable Maven Central or a full disk is one line naming the file and
what to do.
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.request

from laminar_assets.engine.spark import JAR_GROUPS, Jar, jar_dir
from laminar_assets.errors import EnvironmentProblem


def install(group: str, prefix: str | None = None) -> list[str]:
    """Make sure every jar of `group` is installed; returns their paths."""
    if group not in JAR_GROUPS:
        raise EnvironmentProblem(f"unknown jar group {group!r}: expected one of {', '.join(JAR_GROUPS)}")
    folder = jar_dir(group, prefix)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for jar in JAR_GROUPS[group]:
        path = os.path.join(folder, jar.file_name)
        if not (os.path.isfile(path) and os.path.getsize(path) == jar.size and _sha1(path) == jar.sha1):
            _download(jar, path)
        paths.append(path)
    return paths


def _download(jar: Jar, path: str) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with urllib.request.urlopen(jar.url, timeout=60) as response, open(partial, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
        digest = _sha1(partial)
        if digest != jar.sha1:
            raise EnvironmentProblem(f"{jar.url} has SHA-1 {digest}, not the pinned {jar.sha1}: the download is "
                                     "corrupt or the artifact changed; try again, or check the mirror")
        os.replace(partial, path)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise EnvironmentProblem(f"cannot download {jar.url}: {exc}; Maven Central must be reachable once to "
                                 f"install {jar.coordinates} (or put the file at {path})") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _sha1(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    groups = argv or ["s3", "delta"]
    try:
        for group in groups:
            paths = install(group)
            size = sum(os.path.getsize(p) for p in paths) / 1e6
            print(f"{group}: {len(paths)} jars in {jar_dir(group)} ({size:.1f} MB)")
    except (EnvironmentProblem, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
