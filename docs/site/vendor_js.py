"""Fetch the website's JavaScript from the npm registry into its static files.

Usage: ``python docs/site/vendor_js.py`` (needs the npm registry; building the site does not).

- ``@jupyter-widgets/html-manager``'s ``embed.js`` renders each lesson's stored widgets from the
  notebook's saved widget state (myst-nb would load it from a CDN), with the Font Awesome fonts
  it loads from beside itself;
- MathJax 3's ``tex-chtml.js`` typesets the lessons' formulas (Sphinx would load it from a CDN),
  with its fonts, which it loads from ``output/chtml/fonts/woff-v2/`` beside itself.

So the site works with no network. Each tarball's SHA-512 must match the registry's published
integrity; the files copied are listed, with their SHA-256, in ``_static/vendor/SOURCES.md``,
which ``tests/test_site.py`` checks against the files.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
VENDOR = Path(__file__).resolve().parent / "_static" / "vendor"
# folder, npm package, version (html-manager 1.x goes with ipywidgets 8), which files, licence
PACKAGES = [
    ("html-manager", "@jupyter-widgets/html-manager", "1.0.15",
     lambda name: name == "dist/embed.js" or (name.startswith("dist/") and name.endswith(".woff2")),
     "BSD-3-Clause, Copyright (c) 2015 Project Jupyter Contributors"),
    ("mathjax", "mathjax", "3.2.2",
     lambda name: name == "es5/tex-chtml.js" or name.startswith("es5/output/chtml/fonts/woff-v2/"),
     "Apache-2.0, Copyright (c) 2009-2022 The MathJax Consortium"),
]


def fetch(package: str, version: str) -> tuple[bytes, dict]:
    with urllib.request.urlopen(f"{REGISTRY}/{package}/{version}", timeout=60) as response:
        meta = json.load(response)["dist"]
    with urllib.request.urlopen(meta["tarball"], timeout=120) as response:
        tarball = response.read()
    algorithm, expected = meta["integrity"].split("-", 1)
    if algorithm != "sha512" or base64.b64encode(hashlib.sha512(tarball).digest()).decode() != expected:
        raise SystemExit(f"{meta['tarball']}: its SHA-512 is not the registry's {meta['integrity']}; not copied.")
    return tarball, meta


def main() -> None:
    lines = ["# JavaScript the website vendors", "",
             "Fetched from the npm registry by `python docs/site/vendor_js.py`, each tarball checked against "
             "the registry's integrity hash. The licences are the packages' own (each folder's LICENSE).", ""]
    for folder, package, version, wanted, licence in PACKAGES:
        tarball, meta = fetch(package, version)
        target = VENDOR / folder
        license_text = (target / "LICENSE").read_bytes() if (target / "LICENSE").exists() else None
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        rows = []
        with tarfile.open(fileobj=io.BytesIO(tarball)) as archive:
            for member in archive.getmembers():
                name = member.name.removeprefix("package/")
                if member.isfile() and (wanted(name) or name in ("LICENSE", "LICENSE.md")):
                    data = archive.extractfile(member).read()
                    local = Path(name).name if folder == "html-manager" else name.removeprefix("es5/")
                    local = "LICENSE" if name.startswith("LICENSE") else local
                    (target / local).parent.mkdir(parents=True, exist_ok=True)
                    (target / local).write_bytes(data)
                    rows.append(f"| `{folder}/{local}` | {len(data):,} | `{hashlib.sha256(data).hexdigest()}` |")
        if not (target / "LICENSE").exists():
            if license_text is None:
                raise SystemExit(f"{package} ships no LICENSE: put its licence text in {target / 'LICENSE'} first.")
            (target / "LICENSE").write_bytes(license_text)  # html-manager's tarball has none: ipywidgets' own
        lines += [f"## {package} {version} ({licence})", "", f"{meta['tarball']}, integrity `{meta['integrity']}`",
                  "", "| file | bytes | SHA-256 |", "|---|---:|---|", *sorted(rows), ""]
        print(f"copied {len(rows)} files of {package} {version} into {target}")
    (VENDOR / "SOURCES.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
