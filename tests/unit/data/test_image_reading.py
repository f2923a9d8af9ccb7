"""Image files at their real depth: 16-bit PNG/TIFF, DICOM windows, colour, alpha, aspect,
and the data check's warnings on constant and saturated images (fed_auc.data.images)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fed_auc.cli import main
from fed_auc.data.cards import data_card, render_data_card
from fed_auc.data.csv_images import load_csv_images
from fed_auc.data.images import apply_window, read_image
from fed_auc.data.memmap import gather
from fed_auc.data.partition import partition_pool
from fed_auc.data.reading import DataReading
from tests.support.data_files import write_dicom, write_png, write_png16


def _card(pool):
    (site,), _ = partition_pool(pool, "iid", 1, 0)
    return data_card(site)


def _counts(pool) -> dict[str, int]:
    """The card's image counts over the whole pool (too small a pool for a site's splits)."""
    return pool.image_report(np.arange(len(pool)))["counts"]


def test_16bit_png_keeps_its_contrast_instead_of_clipping_at_255(tmp_path):
    ramp = np.linspace(0, 4095, 16 * 16).reshape(16, 16).astype(np.uint16)  # 12-bit in 16
    write_png16(tmp_path / "ramp.png", ramp)
    assert Image.open(tmp_path / "ramp.png").mode == "I;16"
    image = read_image(tmp_path / "ramp.png", None)[0].numpy()
    assert image == pytest.approx(ramp / 4095.0, abs=1e-6)  # own min..max, order kept
    assert float(image.min()) == 0.0 and float(image.max()) == 1.0
    # A site of 16-bit images whose positives are brighter in the centre: the pool sees it.
    rng = np.random.default_rng(0)
    rows = ["path,label"]
    for i in range(12):
        pixels = rng.integers(0, 2000, (16, 16))
        pixels[5:11, 5:11] += 2000 * (i % 2)
        write_png16(tmp_path / f"x{i}.png", pixels)
        rows.append(f"x{i}.png,{i % 2}")
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    pool = load_csv_images(tmp_path / "d.csv", image_size=16)
    assert float(pool.images.std()) > 0.1 and float(pool.images.mean()) < 0.6  # not all 1.0
    centre = pool.images[:, 0, 5:11, 5:11].mean(dim=(1, 2))
    positive = pool.labels[:, 0] == 1
    assert float(centre[positive].min()) > float(centre[~positive].max())
    card = _card(pool)
    assert card["images"]["counts"]["16-bit or deeper (scaled by own min..max)"] == 12
    assert card["warnings"] == [] and card["splits"]["train"]["intensity"]["std"] > 0.1


def test_16bit_big_endian_int_and_float_tiffs_are_scaled_by_their_range(tmp_path):
    values = np.arange(64, dtype=np.float64).reshape(8, 8) * 1000
    Image.frombytes("I;16B", (8, 8), values.astype(">u2").tobytes()).save(tmp_path / "b.tif")
    Image.fromarray(values.astype(np.int32) - 5000, "I").save(tmp_path / "i.tif")
    Image.fromarray((values / 7.0).astype(np.float32), "F").save(tmp_path / "f.tif")
    for name in ("b.tif", "i.tif", "f.tif"):
        image = read_image(tmp_path / name, None)[0].numpy()
        assert image == pytest.approx(values / values.max(), abs=1e-5), name


def test_rgb_becomes_luminance_and_alpha_is_composited_onto_black(tmp_path):
    red = np.zeros((8, 8, 3), np.uint8)
    red[..., 0] = 255
    Image.fromarray(red).save(tmp_path / "red.png")
    grey = np.repeat(np.full((8, 8, 1), 100, np.uint8), 3, axis=2)
    Image.fromarray(grey).save(tmp_path / "grey_rgb.png")
    rgba = np.full((8, 8, 4), 255, np.uint8)  # white ...
    rgba[:, :4, 3] = 0  # ... transparent on the left half ...
    rgba[:, 4:, 3] = 128  # ... half opaque on the right
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    assert read_image(tmp_path / "red.png", None).unique().item() == pytest.approx(76 / 255)
    assert read_image(tmp_path / "grey_rgb.png", None).unique().item() == pytest.approx(100 / 255)
    image = read_image(tmp_path / "rgba.png", None)[0].numpy()
    assert (image[:, :4] == 0).all() and image[:, 4:] == pytest.approx(128 / 255, abs=1 / 255)
    write_png(tmp_path / "plain.png", 100, seed=0, size=8)
    (tmp_path / "d.csv").write_text(
        "path,label\nred.png,1\ngrey_rgb.png,0\nrgba.png,1\nplain.png,0\n"
    )
    counts = _counts(load_csv_images(tmp_path / "d.csv", image_size=8))
    assert counts["stored in colour (made luminance)"] == 3
    assert counts["with colour content (channels differ: overlays, annotations?)"] == 1
    assert counts["with alpha (composited onto black)"] == 1


def test_non_square_images_are_padded_by_default_or_cropped_and_the_card_says_so(tmp_path):
    pixels = np.tile(np.linspace(40, 240, 16), (8, 1)).astype(np.uint8)  # 8 high, 16 wide
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    scaled = pixels / 255.0
    padded = read_image(tmp_path / "wide.png", None)[0].numpy()
    assert padded.shape == (16, 16)
    assert (padded[:4] == 0).all() and (padded[12:] == 0).all()  # black bands, centred
    assert padded[4:12] == pytest.approx(scaled)
    cropped = read_image(tmp_path / "wide.png", None, aspect="crop")[0].numpy()
    assert cropped.shape == (8, 8) and cropped == pytest.approx(scaled[:, 4:12])
    stretched = read_image(tmp_path / "wide.png", 8, aspect="stretch")[0].numpy()
    assert stretched.shape == (8, 8) and stretched.min() > 0.1  # no black band
    write_png(tmp_path / "square.png", 100, seed=0, size=8)
    (tmp_path / "d.csv").write_text("path,label\n" + "wide.png,1\nsquare.png,0\n" * 4)
    for aspect in ("pad", "crop"):
        reading = DataReading(aspect=aspect)
        card = _card(load_csv_images(tmp_path / "d.csv", image_size=8, reading=reading))
        assert card["images"]["policy"]["aspect"] == aspect
        assert card["images"]["counts"]["non-square"] == 4
        assert f"- Non-square: {aspect}" in render_data_card(card)
    with pytest.raises(ValueError, match="aspect = 'squash'"):
        load_csv_images(tmp_path / "d.csv", image_size=8, reading=DataReading(aspect="squash"))


def test_dicom_rescale_voi_window_and_monochrome1(tmp_path):
    stored = (np.arange(256, dtype=np.uint16).reshape(16, 16) * 16).astype(np.uint16)
    window = (1000.0, 2000.0)
    write_dicom(tmp_path / "w.dcm", stored, slope=2.0, intercept=-1000.0, window=window)
    write_dicom(
        tmp_path / "w1.dcm", stored, "MONOCHROME1", slope=2.0, intercept=-1000.0, window=window
    )
    write_dicom(tmp_path / "r.dcm", stored, slope=2.0, intercept=-1000.0)
    modality = stored * 2.0 - 1000.0  # -1000 .. 7160
    expected = np.clip((modality - 999.5) / 1999 + 0.5, 0, 1)  # PS3.3 C.11.2.1.2.1
    image = read_image(tmp_path / "w.dcm", None)[0].numpy()
    assert image == pytest.approx(expected, abs=1e-6)
    assert 0 < (image == 1).mean() < 0.9 and (image == 0).any()  # the window clips both ends
    assert read_image(tmp_path / "w1.dcm", None)[0].numpy() == pytest.approx(1 - expected, 1e-6)
    no_window = read_image(tmp_path / "r.dcm", None)[0].numpy()
    assert no_window == pytest.approx((modality + 1000) / 8160, abs=1e-6)  # own min..max
    assert apply_window(np.array([0.0, 1.0]), 0.5, 1.0, "LINEAR").tolist() == [0.0, 1.0]
    (tmp_path / "d.csv").write_text("path,label\nw.dcm,1\nw1.dcm,0\nr.dcm,1\n")
    counts = _counts(load_csv_images(tmp_path / "d.csv", image_size=8))
    assert counts["DICOM"] == 3 and counts["DICOM with rescale slope/intercept"] == 3
    assert counts["DICOM with a VOI window (applied)"] == 2
    assert counts["DICOM MONOCHROME1 (inverted)"] == 1


def _suspect_site(tmp_path: Path) -> Path:
    """A site file whose CSV has a constant image and a saturated one among good images."""
    rows = ["path,label,split"]
    for i in range(12):
        write_png(tmp_path / f"ok{i}.png", 80 + 60 * (i % 2), seed=i, size=8)
        rows.append(f"ok{i}.png,{i % 2},{('train', 'train', 'val', 'test')[i // 2 % 4]}")
    Image.fromarray(np.full((8, 8), 255, np.uint8)).save(tmp_path / "flat.png")
    white = np.full((8, 8), 255, np.uint8)
    white[:3] = 30
    Image.fromarray(white).save(tmp_path / "white.png")
    rows += ["flat.png,1,train", "white.png,0,train"]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    site = tmp_path / "s.toml"
    site.write_text('name = "s"\n[data]\nspec = "csv:d.csv"\n')
    return site


def test_constant_and_saturated_images_warn_by_name_and_strict_refuses(tmp_path, capsys):
    site = _suspect_site(tmp_path)
    pool = load_csv_images(tmp_path / "d.csv", image_size=8)
    card = _card(pool)
    assert card["images"]["constant"] == 1 and card["images"]["saturated"] == 1
    constant, saturated = card["warnings"]
    assert constant.startswith("1 of 14 constant image(s)") and "flat.png (line 14)" in constant
    assert saturated.startswith("1 of 14 saturated image(s)") and "white.png (line 15)" in saturated
    markdown = render_data_card(card)
    assert "## Warnings" in markdown and "flat.png (line 14)" in markdown
    assert main(["node", "--site", str(site), "--image-size", "8", "--check"]) == 0
    out, err = capsys.readouterr()
    assert "is ready with 2 warning(s)" in out and "## Warnings" in out
    assert "warning:" in err and "flat.png (line 14)" in err and "white.png (line 15)" in err
    with pytest.raises(SystemExit) as refused:
        main(["node", "--site", str(site), "--image-size", "8", "--check", "--strict"])
    message = str(refused.value.code)
    assert message.startswith("fed-auc node --strict: ") and "refused" in message
    assert "flat.png (line 14)" in message and "white.png (line 15)" in message
    out_dir = tmp_path / "cards"
    args = ["data-card", "--data", f"csv:{tmp_path / 'd.csv'}", "--partition", "iid",
            "--sites", "1", "--image-size", "8", "--out", str(out_dir)]  # fmt: skip
    assert main(args) == 0
    written = json.loads((out_dir / "site0.json").read_text())
    assert len(written["warnings"]) == 2 and written["images"]["policy"]["aspect"] == "pad"
    with pytest.raises(SystemExit, match=r"data-card --strict: 2 warning\(s\)"):
        main([*args, "--strict"])


def test_a_clean_site_passes_strict(tmp_path, capsys):
    site = _suspect_site(tmp_path)
    rows = (tmp_path / "d.csv").read_text().splitlines()
    (tmp_path / "d.csv").write_text("\n".join(rows[:-2]) + "\n")
    assert main(["node", "--site", str(site), "--image-size", "8", "--check", "--strict"]) == 0
    out, err = capsys.readouterr()
    assert "s.toml is ready (" in out and "warning" not in err


@pytest.mark.parametrize("name", ["t16.png", "t.tif", "t.dcm", "t.jpg"])
def test_truncated_image_names_the_csv_line_and_the_file(tmp_path, name):
    pixels = np.random.default_rng(0).integers(0, 4000, (64, 64))
    whole = tmp_path / f"whole{Path(name).suffix}"
    if name.endswith(".dcm"):
        write_dicom(whole, pixels)
    elif name.endswith(".jpg"):
        Image.fromarray((pixels % 256).astype(np.uint8)).save(whole, quality=95)
    else:
        write_png16(whole, pixels)
        if name.endswith(".tif"):
            Image.open(whole).save(whole.with_suffix(".tif"))
            whole = whole.with_suffix(".tif")
    data = whole.read_bytes()
    (tmp_path / name).write_bytes(data[: len(data) // 2])
    write_png(tmp_path / "ok.png", 100, seed=0)
    (tmp_path / "d.csv").write_text(f"path,label\nok.png,1\n{name},0\n")
    with pytest.raises(ValueError, match=rf"d\.csv line 3: cannot read image .*{name}"):
        load_csv_images(tmp_path / "d.csv", image_size=8)


def test_a_dicom_window_of_width_0_names_the_file_and_the_field(tmp_path):
    write_dicom(tmp_path / "w0.dcm", np.arange(64).reshape(8, 8), window=(100.0, 0.0))
    write_png(tmp_path / "ok.png", 100, seed=0)
    (tmp_path / "d.csv").write_text("path,label\nok.png,1\nw0.dcm,0\n")
    with pytest.raises(ValueError, match=r"d\.csv line 3: cannot read image .*w0\.dcm: Window"):
        load_csv_images(tmp_path / "d.csv", image_size=8)


def test_aspect_in_a_site_file_and_the_experiment_is_checked_and_used(tmp_path):
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.site import SiteDefinition

    site = _suspect_site(tmp_path)
    rows = (tmp_path / "d.csv").read_text().splitlines()[:-2]
    Image.fromarray(np.full((8, 16), 200, np.uint8)).save(tmp_path / "wide.png")
    rows.append("wide.png,1,train")
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    site.write_text('name = "s"\n[data]\nspec = "csv:d.csv"\naspect = "crop"\n')
    data = SiteDefinition.from_toml(site).load(8)
    images = data_card(data)["images"]
    assert images["policy"]["aspect"] == "crop" and images["counts"]["non-square"] == 1
    train = gather(data.train.images)  # from the site's image cache
    wide = train[(train - 200 / 255).abs().amax(dim=(1, 2, 3)) < 1e-3]
    assert len(wide) == 1  # the wide image, cropped: all 200, no black band
    site.write_text('name = "s"\n[data]\nspec = "csv:d.csv"\naspect = "squash"\n')
    with pytest.raises(ValueError, match=r"s\.toml: \[data\] aspect = 'squash'"):
        SiteDefinition.from_toml(site)
    assert ExperimentConfig(aspect="crop").aspect == "crop"
    with pytest.raises(ValueError, match="aspect must be one of"):
        ExperimentConfig(aspect="squash")
