"""Images per second from a PACS: Debian's Orthanc (DICOMweb plugin) on loopback.

N labelled 16-bit instances at each image size are stored in a fresh Orthanc. Three ways to
get them, side by side on the same server:

- ``plain``: the baseline, a loop of WADO-RS GETs with ``requests`` (one instance each,
  multipart answer kept as bytes), nothing written;
- ``fetch``: a PACS site's first load (``SiteDefinition.load``: QIDO-RS, WADO-RS into the
  node's state directory, then decoded into the image cache at 28 px);
- ``again``: the same site loaded again (a QIDO-RS query, nothing fetched, the decoded cache
  read).

    python -m benchmarks.systems.pacs_fetch [--images 200] [--sizes 256 1024]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import requests

from benchmarks.common.dicom_studies import make_studies, pacs_site_file, write_labels
from benchmarks.common.machine import describe
from benchmarks.common.orthanc import PASSWORD, PASSWORD_ENV, USER, start_orthanc
from fed_auc.site import SiteDefinition


def measure(images: int, size: int, root: Path) -> dict[str, float]:
    server = start_orthanc(root / "orthanc")
    try:
        made = make_studies(root / "dicom", patients=images, unlabelled=0, size=size)
        for image in made:
            server.upload(image.path)
        labels = write_labels(root / "labels.csv", made)
        site = SiteDefinition.from_toml(
            pacs_site_file(root, "bench", server.dicomweb, labels, PASSWORD_ENV)
        )
        session = requests.Session()
        session.auth = (USER, PASSWORD)
        start = time.perf_counter()
        for image in made:
            url = (f"{server.dicomweb}/studies/{image.study}/series/{image.series}"
                   f"/instances/{image.sop}")  # fmt: skip
            answer = session.get(
                url, headers={"Accept": "multipart/related; type=application/dicom"}
            )
            answer.raise_for_status()
        plain = time.perf_counter() - start
        start = time.perf_counter()
        site.load(28)
        fetch = time.perf_counter() - start
        start = time.perf_counter()
        site.load(28)
        again = time.perf_counter() - start
    finally:
        server.stop()
    n = len(made)
    return {"images": n, "size": size, "plain_per_s": n / plain, "fetch_per_s": n / fetch,
            "again_per_s": n / again, "fetch_over_plain": plain / fetch}  # fmt: skip


def table(images: int, sizes: list[int]) -> list[dict[str, float]]:
    """One measurement per image size, each on a fresh Orthanc in a temporary folder."""
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            rows.append(measure(images, size, Path(folder)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="patients (a quarter with 2)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    args = parser.parse_args(argv)
    os.environ[PASSWORD_ENV] = PASSWORD
    print(describe())
    print(
        "| size (px, 16-bit) | images | plain WADO-RS loop (img/s) | PACS site, first load "
        "(img/s) | ratio | loaded again (img/s) |"
    )
    print("|---|---|---|---|---|---|")
    for r in table(args.images, args.sizes):
        print(f"| {r['size']} | {r['images']} | {r['plain_per_s']:.0f} | {r['fetch_per_s']:.0f} | "
              f"{r['fetch_over_plain']:.2f} | {r['again_per_s']:.0f} |")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
