"""assets/plots.py: the metadata plots are real PNGs embedded as data URIs, tables are Dagster tables."""

import base64
import io
import re

from dagster import MarkdownMetadataValue, TableMetadataValue
from PIL import Image

from assets.plots import bar_chart, count_table, histogram


def decoded(value: MarkdownMetadataValue) -> Image.Image:
    match = re.fullmatch(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", value.value)
    assert match, value.value[:80]
    return Image.open(io.BytesIO(base64.b64decode(match.group(1))))


def test_bar_chart_and_histogram_are_pngs_of_the_configured_size():
    bars = decoded(bar_chart({"kept": 962, "lang": 150, "gopher_stop_words": 59}, title="drops", ylabel="documents"))
    clusters = decoded(histogram({"2": 40, "3": 5, "10": 1}, title="clusters", xlabel="size"))  # keys as JSON gives them
    for image in (bars, clusters):
        assert image.format == "PNG" and image.size == (512, 256)  # 6.4 x 3.2 inches at 80 dpi


def test_nothing_to_plot_says_so_instead_of_an_empty_figure():
    assert bar_chart({}, title="hits", ylabel="documents").value == "**hits**: nothing to plot"
    assert "nothing to plot" in histogram({}, title="clusters", xlabel="size").value


def test_count_table_is_sorted_largest_first_with_typed_columns():
    table = count_table({"lang": 150, "kept": 962, "url": 150}, key="reason", value="documents")
    assert isinstance(table, TableMetadataValue)
    assert [r.data for r in table.records] == [
        {"reason": "kept", "documents": 962}, {"reason": "lang", "documents": 150}, {"reason": "url", "documents": 150}]
    assert [(c.name, c.type) for c in table.schema.columns] == [("reason", "string"), ("documents", "int")]
