"""A corpus of bad inputs (configs, config files, the store, state files, images, CSVs, npz
files): each must get an error of the expected type naming the file, field or value."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fed_auc.data.csv_images import load_csv_images
from fed_auc.data.medmnist import load_medmnist
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import CorruptState, load_state, save_state
from fed_auc.store.run_store import RunStore, StoreError


def bad_inputs(workdir: Path) -> dict[str, list[int]]:
    """Kind → [tried, clear]. Clear = the expected error type, naming the file/field/value."""
    results: dict[str, list[int]] = {}

    def expect(kind: str, action: Callable[[], object], errors: tuple, *needles: str) -> None:
        tried_clear = results.setdefault(kind, [0, 0])
        tried_clear[0] += 1
        try:
            action()
        except errors as exc:
            tried_clear[1] += all(n in str(exc) for n in needles)
        except Exception as exc:  # the wrong kind of error counts as unclear
            print(f"{kind}: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)

    config_cases = [
        ({"colour": "red"}, "colour"),
        ({"sites": "four"}, "sites"),
        ({"rounds": 0}, "rounds"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"participation": 1.5}, "participation"),
        ({"algorithm": "sgd"}, "algorithm"),
        ({"local_steps": True}, "local_steps"),
        ({"backend_options": {"server_lr": "fast"}}, "server_lr"),
        ({"local_steps_range": "3-20"}, "local_steps_range"),
        ({"dp_noise": 1.0}, "dp_noise"),
        ({"max_update_norm": 0}, "max_update_norm"),
    ]
    for values, field in config_cases:
        expect("config", lambda v=values: ExperimentConfig(**v), (ValueError, TypeError), field)

    toml = workdir / "bad.toml"
    for text in ("rounds = [", "rounds = 'many'", "colour = 1"):
        toml.write_text(text)
        expect(
            "config file",
            lambda: __import__("fed_auc.cli").cli.main(["simulate", "--config", str(toml)]),
            (SystemExit,),
            str(toml),
        )

    store_dir = workdir / "notsqlite"
    store_dir.mkdir()
    (store_dir / "fed_auc.sqlite").write_bytes(b"\x00garbage" * 1000)
    expect("store file", lambda: RunStore(store_dir), (StoreError,), str(store_dir))

    state = workdir / "local_state.pt"
    for cut in (0.5, 0.99):
        save_state({"c": torch.arange(10_000.0)}, state)
        data = state.read_bytes()
        state.write_bytes(data[: int(len(data) * cut)])
        expect("state file (torn)", lambda: load_state(state), (CorruptState,), str(state))
    save_state({"c": torch.arange(10_000.0)}, state)
    data = bytearray(state.read_bytes())
    data[-3] ^= 1
    state.write_bytes(bytes(data))
    expect("state file (altered)", lambda: load_state(state), (CorruptState,), str(state))

    bad_data_files(workdir, expect)
    return results


def bad_data_files(workdir: Path, expect: Callable) -> None:
    """Broken images, CSVs and npz files, written here; each error must name file and place."""
    data = workdir / "data"
    data.mkdir()
    for i in range(4):
        Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(data / f"ok{i}.png")
    (data / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (data / "text.jpg").write_text("a note, not a JPEG")
    (data / "empty.dcm").write_bytes(b"")
    deep = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)  # 16-bit, as hospitals export
    for suffix in ("png", "tif"):
        Image.fromarray(deep).save(data / f"deep.{suffix}")
        raw = (data / f"deep.{suffix}").read_bytes()
        (data / f"cut16.{suffix}").write_bytes(raw[: len(raw) // 2])
    _dicom(data / "deep.dcm", deep)
    raw = (data / "deep.dcm").read_bytes()
    (data / "cut.dcm").write_bytes(raw[: len(raw) // 2])
    _dicom(data / "window0.dcm", deep, WindowCenter=100, WindowWidth=0)
    csv_cases = {
        "missing image": ("path,label\nok0.png,1\ngone.png,0\n", "gone.png"),
        "corrupt image": ("path,label\nok0.png,1\ncorrupt.png,0\n", "corrupt.png"),
        "not an image": ("path,label\nok0.png,1\ntext.jpg,0\n", "text.jpg"),
        "empty DICOM": ("path,label\nok0.png,1\nempty.dcm,0\n", "empty.dcm"),
        "truncated 16-bit PNG image": ("path,label\nok0.png,1\ncut16.png,0\n", "cut16.png"),
        "truncated 16-bit TIFF image": ("path,label\nok0.png,1\ncut16.tif,0\n", "cut16.tif"),
        "truncated DICOM": ("path,label\nok0.png,1\ncut.dcm,0\n", "cut.dcm"),
        "DICOM window width 0": ("path,label\nok0.png,1\nwindow0.dcm,0\n", "WindowWidth"),
        "label 2": ("path,label\nok0.png,1\nok1.png,2\n", "'2'"),
        "label 'yes'": ("path,label\nok0.png,yes\nok1.png,0\n", "'yes'"),
        "no label column": ("path,finding\nok0.png,1\n", "label"),
        "no path column": ("file,label\nok0.png,1\n", "image path column"),
        "empty CSV": ("", "data"),
        "ragged rows": ('path,label\nok0.png,1,3,"\n', "data"),
    }
    for name, (body, needle) in csv_cases.items():
        path = data / f"{name.replace(' ', '_').replace(chr(39), '')}.csv"
        path.write_text(body)
        kind = "image file" if "image" in name or "DICOM" in name else "CSV"
        expect(
            kind,
            lambda p=path: load_csv_images(p, image_size=8),
            (ValueError,),
            path.name,
            needle,
        )

    outside = workdir / "outside.png"  # a file of the machine, beside the data folder
    Image.fromarray(np.full((8, 8), 90, dtype=np.uint8)).save(outside)
    (data / "link.png").symlink_to(outside)
    escapes = {
        "dot-dot": "../outside.png",
        "absolute": str(outside),
        "symlink": "link.png",
    }
    for name, rel in escapes.items():
        path = data / f"escape_{name.replace('-', '_')}.csv"
        path.write_text(f"path,label\nok0.png,1\n{rel},0\n")
        expect(
            "image path outside the data root",
            lambda p=path: load_csv_images(p, image_size=8),
            (ValueError,),
            path.name,
            "line 3",
            repr(rel),
        )

    good = {
        f"{split}_{part}": (
            np.zeros((4, 8, 8), np.uint8) if part == "images" else np.array([[0], [1], [0], [1]])
        )
        for split in ("train", "val", "test")
        for part in ("images", "labels")
    }
    npz = data / "ok.npz"
    np.savez(npz, **good)
    raw = npz.read_bytes()
    truncated = data / "truncated.npz"
    truncated.write_bytes(raw[: len(raw) // 2])
    expect("npz", lambda: load_medmnist(truncated), (ValueError,), "truncated.npz")
    missing = data / "missing.npz"
    np.savez(missing, **{k: v for k, v in good.items() if not k.startswith("test")})
    expect("npz", lambda: load_medmnist(missing), (ValueError,), "missing.npz", "test_images")
    labels = data / "labels.npz"
    np.savez(labels, **{**good, "val_labels": np.array([[0], [7], [0], [1]])})
    expect("npz", lambda: load_medmnist(labels), (ValueError,), "labels.npz", "7")


def _dicom(path: Path, pixels: np.ndarray, **tags: object) -> None:
    """A minimal 16-bit grayscale DICOM file with extra `tags`."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit, ds.PixelRepresentation = 15, 0
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    for name, value in tags.items():
        setattr(ds, name, value)
    ds.save_as(path, enforce_file_format=True)
