"""The end-to-end scenario both examples must pass, through their HTTP API."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from imagededup_shared import samples
from waiting import wait_until

from .services import Process

MAX_UPLOAD_BYTES = 400_000


def _progress(client: httpx.Client, collection: int) -> dict[str, Any]:
    response = client.get(f"/collections/{collection}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def check_rejections(client: httpx.Client, collection: int, good: Path, media: Path) -> None:
    """Clear 4xx errors, and a rejected request leaves no row and no file behind."""
    png = ("good.png", good.read_bytes(), "image/png")
    assert client.post("/collections", json={"name": ""}).status_code == 422
    response = client.post("/collections/999999/images", files=[("files", png)])
    assert response.status_code == 404 and "999999" in response.json()["detail"]
    text = ("notes.png", b"these are not pixels", "image/png")
    response = client.post(
        f"/collections/{collection}/images", files=[("files", png), ("files", text)]
    )
    assert response.status_code == 415, response.text
    assert "notes.png" in response.json()["detail"]
    big = ("big.png", good.read_bytes()[:64] + b"\0" * MAX_UPLOAD_BYTES, "image/png")
    response = client.post(
        f"/collections/{collection}/images", files=[("files", png), ("files", big)]
    )
    assert response.status_code == 413, response.text
    response = client.post(f"/collections/{collection}/directory", json={"path": "/no/such/dir"})
    assert response.status_code == 422
    assert _progress(client, collection)["images"] == 0
    assert not list(media.rglob("*.*")), "a rejected upload left files behind"


def run_flow(
    client: httpx.Client,
    tmp_path: Path,
    sample_set: samples.SampleSet,
    start_worker: Callable[[], Process],
) -> None:
    media = tmp_path / "media"
    collection = client.post("/collections", json={"name": "holiday", "page_size": 4}).json()["id"]
    check_rejections(client, collection, sample_set.files[0], media)

    # The first group and a single are registered as a directory, with one member of the
    # second group damaged (its first half only); the rest is uploaded.
    damaged = sorted(sample_set.groups[1])[-1]
    folder = tmp_path / "folder"
    folder.mkdir()
    by_name = {path.name: path for path in sample_set.files}
    in_folder = [*sample_set.groups[0], sample_set.files[-1].name]
    for name in in_folder:
        shutil.copy(by_name[name], folder / name)
    (folder / damaged).write_bytes(samples.truncated(by_name[damaged].read_bytes()))
    (folder / "readme.txt").write_text("not an image, not registered")
    uploads = [p for p in sample_set.files if p.name not in in_folder and p.name != damaged]

    worker = start_worker()
    try:
        files = [("files", (p.name, p.read_bytes(), "image/png")) for p in uploads]
        response = client.post(f"/collections/{collection}/images", files=files)
        assert response.status_code == 201, response.text
        response = client.post(f"/collections/{collection}/directory", json={"path": str(folder)})
        assert response.status_code == 201, response.text
        broken = next(i["id"] for i in response.json()["images"] if i["filename"] == damaged)
        assert client.post(f"/collections/{collection}/compare").status_code == 200
        response = client.post(f"/collections/{collection}/images", files=files[:1])
        assert response.status_code == 409, "a sealed collection took another image"
        total = len(sample_set.files)

        def progress() -> dict[str, Any]:
            return _progress(client, collection)

        def diagnose() -> str:
            return worker.output()[-3000:]

        wait_until(
            lambda: (p := progress())["hashed"] == total - 1 and p["failed"] == 1 and p,
            "every image but the damaged one hashed",
            diagnose=diagnose,
        )
        image = client.get(f"/images/{broken}").json()
        assert image["status"] == "failed"
        assert damaged in image["error"] and "cannot decode image" in image["error"], image
        # The comparison waits for every image of the collection: give it time to
        # (wrongly) start, then check it has not.
        time.sleep(2.0)
        stalled = progress()
        assert stalled["compare"] in (None, "waiting"), stalled
        assert stalled["pages_compared"] == 0, stalled

        # Repair the file, then retry: only a failed image can be retried.
        shutil.copy(by_name[damaged], folder / damaged)
        assert client.post(f"/images/{broken - 1}/retry").status_code == 409
        assert client.post(f"/images/{broken}/retry").status_code == 200
        done = wait_until(
            lambda: (p := progress())["compare"] == "finished" and p,
            "the comparison to finish",
            diagnose=diagnose,
        )
        assert done["hashed"] == total and done["failed"] == 0, done
        # Pages of 4 images (each against all later ones), then one to write the groups.
        assert done["pages_compared"] == -(-total // 4), done
        assert done["pairs_compared"] == total * (total - 1) // 2, done
        assert client.get(f"/images/{broken}").json()["status"] == "finished"

        groups = client.get(f"/collections/{collection}/groups").json()["groups"]
        found = {frozenset(i["filename"] for i in g["images"]) for g in groups}
        assert found == set(sample_set.groups), (found, sample_set.groups)
        assert done["groups_found"] == len(sample_set.groups)
        thumbnails = list((media / "thumbnails").glob("*.png"))
        assert len(thumbnails) == total
    finally:
        status = worker.terminate()
    assert status == 0, worker.output()
