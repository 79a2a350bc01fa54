"""container/versions.toml: every pin says where its source was read, so that a refresher can read it again."""

from __future__ import annotations

from urllib.parse import urlsplit

from training_constructs.images.image_versions import VERSIONS_FILE, load_versions

VERSIONS = load_versions()


def test_every_pin_names_https_addresses_of_what_was_read():
    for pin in VERSIONS.pins.values():
        assert pin.source_urls, f"{pin.name}: no source_urls in {VERSIONS_FILE.name}"
        for url in pin.source_urls:
            parts = urlsplit(url)
            assert parts.scheme == "https" and "." in parts.netloc and " " not in url, f"{pin.name}: {url!r}"
        assert len(set(pin.source_urls)) == len(pin.source_urls), pin.name


def test_a_pin_without_addresses_reads_as_none_and_the_others_keep_theirs(tmp_path):
    text = VERSIONS_FILE.read_text()
    start = text.index("source_urls = [", text.index("[pins.TORCH_VERSION]"))
    stripped = text[:start] + text[text.index("]\n", start) + 2 :]
    path = tmp_path / "versions.toml"
    path.write_text(stripped)
    assert load_versions(path).pins["TORCH_VERSION"].source_urls == ()
    assert load_versions(path).pins["NCCL_VERSION"].source_urls == VERSIONS.pins["NCCL_VERSION"].source_urls


def test_the_reference_page_links_each_address():
    # The committed page (tests/test_docs.py checks it is what `make docs-gen` writes).
    page = (VERSIONS_FILE.parents[1] / "docs" / "reference" / "image-versions.md").read_text()
    for pin in VERSIONS.pins.values():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{pin.name}` |"))
        for url in pin.source_urls:
            assert f"]({url})" in row, (pin.name, url)
