"""assets/plots.py: the metadata plots are real PNGs embedded as data URIs, tables are Dagster tables."""

import base64
import io
import re

from dagster import MarkdownMetadataValue, TableMetadataValue
from PIL import Image

from assets.plots import bar_chart, count_table, grouped_bar_chart, histogram


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
    assert "nothing to plot" in grouped_bar_chart({}, title="lm-eval", ylabel="score").value
    assert "nothing to plot" in histogram({}, title="clusters", xlabel="size").value


def test_count_table_is_sorted_largest_first_with_typed_columns():
    table = count_table({"lang": 150, "kept": 962, "url": 150}, key="reason", value="documents")
    assert isinstance(table, TableMetadataValue)
    assert [r.data for r in table.records] == [
        {"reason": "kept", "documents": 962}, {"reason": "lang", "documents": 150}, {"reason": "url", "documents": 150}]
    assert [(c.name, c.type) for c in table.schema.columns] == [("reason", "string"), ("documents", "int")]


def test_a_line_chart_of_several_series_draws_one_coloured_curve_each():
    from assets.plots import line_chart

    one = decoded(line_chart([(0, 0.25), (1, 0.3)], title="acc", xlabel="tokens", ylabel="accuracy")).convert("RGB")
    two = decoded(line_chart({"piqa acc_norm": [(0, 0.5), (10, 0.55)], "arc_easy acc_norm": [(0, 0.25), (10, 0.3)]},
                             title="zero-shot", xlabel="tokens", ylabel="accuracy")).convert("RGB")
    assert two.size == (512, 256)
    orange = lambda image: sum(1 for r, g, b in image.getdata() if r > 200 and 100 < g < 150 and b < 60)
    assert orange(two) > 20 and orange(one) == 0  # matplotlib's second colour: the second series has its own curve
    assert "nothing to plot" in line_chart({"piqa acc": []}, title="zero-shot", xlabel="tokens", ylabel="acc").value


def test_grouped_bars_draw_one_bar_per_stage_in_each_task_with_error_bars():
    scores = {"arc_easy acc_norm": {"main": 0.28, "anneal": 0.34}, "piqa acc_norm": {"main": 0.55, "anneal": 0.57}}
    errors = {"arc_easy acc_norm": {"main": 0.06, "anneal": 0.07}, "piqa acc_norm": {"main": 0.07, "anneal": 0.07}}
    image = decoded(grouped_bar_chart(scores, errors=errors, title="lm-eval, main -> anneal", ylabel="score"))
    assert image.format == "PNG" and image.size == (512, 256)
    # Two colours of bars (the default cycle's first two: main blue, anneal orange).
    colours = {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 16)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours
