"""``bench.experiment.report``: the static results page from a small fake results tree written through
``bench.experiment.render``."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from bench.experiment import browser, report  # noqa: E402
from bench.experiment.render import write_table  # noqa: E402
from bench.experiment.result import Result, bullets, grid, heading  # noqa: E402

NAN = math.nan
ODD = "A<b>&c"  # a method name that must come out escaped
PROTOCOL = {"stage": "post", "selection": "best", "weighting": "unweighted"}


def frame_of(cells: list[tuple[Any, ...]], **attrs: Any) -> pd.DataFrame:
    """A collected frame (``bench.experiment.collect.collect``'s columns) from (method, column, mean, std, seeds,
    paper_mean, paper_std) tuples."""
    rows = [{"method": m, "column": c, "mean": mean, "std": std, "seeds": n, "paper_mean": pm, "paper_std": ps,
             "paper_source": "table" if not math.isnan(pm) else ""} for m, c, mean, std, n, pm, ps in cells]
    frame = pd.DataFrame(rows)
    frame["diff"] = frame["mean"] - frame["paper_mean"]
    frame["beyond_2std"] = (frame["diff"].abs() > 2 * frame["std"]) & frame["std"].notna() & frame["diff"].notna()
    frame.attrs.update({"stale_cells": [], "diverged_cells": [], "stale": [], "seeds": [2], "test_images": [50, 60],
                        "paired": [], "ordering": []} | attrs)
    return frame


def spec_of(paper: str, table: str, methods: list[str]) -> dict[str, Any]:
    return {"paper": paper, "table": table, "title": f"{paper} {table} title", "protocol": PROTOCOL,
            "rows": [{"name": m} for m in methods]}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two papers (one table with paired/tau stats and a paper-scale twin, one figure-like table with a failed
    and a stale cell), a figure, non-table pages and a non-table CSV with a sibling .md."""
    results = tmp_path_factory.mktemp("tree") / "results"
    methods = ["FedAvg", ODD, "FedX"]
    cells = [("FedAvg", "C1", 80.0, 1.0, 2, 54.36, 2.73), (ODD, "C1", 85.0, 0.5, 2, 60.0, 1.0),
             ("FedX", "C1", 90.0, 0.2, 2, 70.5, 0.5), ("FedAvg", "C2", 70.0, 2.0, 2, 40.0, NAN),
             (ODD, "C2", 71.0, 1.0, 2, 41.0, NAN), ("FedX", "C2", 72.0, 1.5, 2, 42.0, NAN)]
    paired = [{"column": "C1", "row": "FedX", "other": other, "best_other": ODD if other == ODD else None, "seeds": 2,
               "mean_diff": diff, "std_diff": NAN, "ci_low": NAN, "ci_high": NAN, "confidence": 0.95, "higher_in": 2,
               "paper_diff": paper, "agrees": True, "contradicts": False}
              for other, diff, paper in ((ODD, 5.0, 10.5), ("FedAvg", 10.0, 16.14))]
    ordering = [{"column": "C1", "rows": 3, "tau": 1.0, "ours_best": "FedX", "paper_best": "FedX"},
                {"column": "C2", "rows": 3, "tau": NAN, "ours_best": "FedX", "paper_best": "FedX"}]
    for scale in ("mini", "paper"):
        write_table(spec_of("alpha", "2", methods), scale, frame_of(cells, paired=paired, ordering=ordering), [],
                    results)
    beta = frame_of([("FedAvg", "D1", NAN, NAN, 0, NAN, NAN), ("FedProx", "D1", 66.6, 3.0, 2, NAN, NAN)],
                    stale_cells=[["FedProx", "D1"]], stale=["FedProx | D1: 2 of 2 runs from other code than this tree"])
    write_table(spec_of("beta", "fig3", ["FedAvg", "FedProx"]), "mini", beta,
                ["failed: FedAvg | D1 | seed 1 (/runs/x/error.txt)"], results)
    (results / "beta" / "fig3.md").write_text("# Markdown the page never reads\n")  # all of it is in fig3.stats.json
    cost = Result("Cost per round", ["Measured **here**."],
                  [heading("Layout", 2), grid(["method", "s"], [["fedavg", "1.5"]]), bullets(["a note"], "Notes:")])
    (results / "beta" / "cost.json").write_text(json.dumps({"rows": [], "result": cost.as_json()}))
    (results / "beta" / "cost.md").write_text("# Markdown the page never reads\n")
    figure = results / "alpha" / "figures" / "curves" / "fig 1=a.png"
    figure.parent.mkdir(parents=True)
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [1, 3, 2])
    fig.savefig(figure)
    plt.close(fig)
    (results / "beta" / "notes.md").write_text("# Notes & more\n\nSome **bold** text with `code`.\n\n- one\n- two <x>\n"
                                               "\n| k | v |\n|---|---|\n| speed | 1.5 |\n")
    (results / "beta" / "efficiency.csv").write_text("row,method,gflops\nfedavg,fedavg,1.0\n")
    (results / "beta" / "efficiency.md").write_text("# Efficiency\n\n| method | gflops |\n|---|---|\n"
                                                    "| fedavg | 1.0 |\n")
    (results / "bench").mkdir()
    (results / "bench" / "bench.md").write_text("| workload | s/round |\n|---|---|\n| small | 4.46 |\n")
    (results / "bench" / "bench.csv").write_text("method,column,mean,std,seeds\nx,y,1,0,1\n")  # not a paper table
    return {"results": results, "figures": [figure], "tables": ["alpha-table2", "alpha-paper-scale-table2",
                                                                "beta-fig3"]}


def img_sources(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


def test_page_has_every_table_paper_value_comparison_figure_and_provenance(tree: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    results = tree["results"]
    out = report.build(results, tmp_path / "site" / "index.html")
    page = out.read_text()
    for anchor in tree["tables"]:
        assert f'id="{anchor}"' in page and f'href="#{anchor}"' in page  # section and table of contents
    assert page.count('<table class="results"') == 3
    for method in ("FedAvg", "FedX", "FedProx"):
        assert f'<td class="m">{method}</td>' in page
    assert ODD not in page and '<td class="m">A&lt;b&gt;&amp;c</td>' in page  # escaped everywhere
    assert "54.36 ± 2.73" in page and "80.00 ± 1.00" in page and "+25.64" in page  # paper, ours, difference
    assert "40.00" in page and "n=2" in page
    assert "C1: τ = +1.00 over 3 rows; best here FedX, in the paper FedX" in page
    assert "C2: τ = n/a" in page
    assert "FedX − A&lt;b&gt;&amp;c = +5.00 over 2 seeds" in page and "FedX − FedAvg" not in page  # best other
    assert "<td>+10.00 (paper +16.14) ✓</td>" in page  # FedX minus each other row
    assert page.count("minus each other row") == 2  # once per alpha table: from .stats.json, not again from the .md
    assert "Mini-scale stand-in" in page and "Protocol: stage=post, selection=best" in page
    # ⚑ only at paper scale, ‡ for the stale cell, ✗ for the failed one, its note listed under the table
    mini, paper_scale = page.split('id="alpha-table2"')[1], page.split('id="alpha-paper-scale-table2"')[1]
    assert "⚑</span>" not in mini.split("</section>")[0] and "⚑</span>" in paper_scale.split("</section>")[0]
    beta = page.split('id="beta-fig3"')[1].split("</section>")[0]
    assert 'class="missing"' in beta and "✗</span>" in beta and '<td class="missing">failed <span' in beta
    assert 'class="stale"' in beta and "‡</span>" in beta and "failed: FedAvg | D1 | seed 1" in beta
    assert "paper</th>" not in beta  # no published numbers: ours only
    assert "beta fig3 title" in beta and "never reads" not in page  # the title from the result, not the Markdown
    assert ("<h3>Cost per round</h3>\n<p>Measured <strong>here</strong>.</p>\n<h4>Layout</h4>\n"
            '<div class="scroll"><table><thead><tr><th>method</th><th>s</th></tr></thead><tbody><tr><td class=m>fedavg'
            "</td><td>1.5</td></tr></tbody></table></div>\n<p>Notes:</p>\n<ul><li>a note</li></ul>") in page
    # provenance: page-level block and per table
    assert 'id="provenance"' in page and "Generated " in page
    assert page.count('class="prov table-provenance"') == 3
    assert "runs averaged: 12" in page and "runs averaged: 2" in page  # sum of the cells' seeds
    assert "commit: None (not a git checkout)" in page and "torch " in page and "CPUs" in page
    assert "table written: " in page
    # figure: a relative src that resolves from the page's folder
    sources = img_sources(page)
    assert len(sources) == len(tree["figures"])
    for src in sources:
        assert not src.startswith(("/", "file:")) and (out.parent / unquote(src)).resolve().exists()
    assert "curves/fig 1=a.png</figcaption>" in page
    # non-table Markdown pages, including a CSV that is not a table; bench's CSV is no table
    assert "<h3>Notes &amp; more</h3>" in page and "<strong>bold</strong>" in page and "<code>code</code>" in page
    assert "<li>two &lt;x&gt;</li>" in page and "<td>1.5</td>" in page
    assert 'id="beta-page-efficiency.md"' in page and 'id="bench-page-bench.md"' in page and "4.46" in page


def test_cli_writes_the_page_atomically_and_returns_0(tree: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "site" / "page.html"
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        replaced.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    assert report.main(["--results", str(tree["results"]), "--out", str(out)]) == 0
    assert [Path(dst) for _, dst in replaced] == [out]
    assert Path(replaced[0][0]).parent == out.parent and Path(replaced[0][0]) != out  # temp file beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["page.html"]  # no temp file left
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert report.main(["--results", str(tmp_path / "absent")]) == 2


def dump_dom(page: Path, budget_ms: int = 5000) -> str:
    """The page's DOM after it loaded (``--dump-dom``; ``--virtual-time-budget`` lets images and scripts run)."""
    done = browser.run_chromium(page, f"--virtual-time-budget={budget_ms}", "--dump-dom")
    assert done.returncode == 0 and done.stdout.strip(), f"chromium --dump-dom failed: {done.stderr[-2000:]}"
    return done.stdout


def test_page_loads_in_headless_chromium_with_every_table_and_image(tree: dict[str, Any], tmp_path: Path) -> None:
    browser.chromium()  # Debian's chromium: `make setup` and .ci/run install it; its error says how otherwise
    out = report.build(tree["results"], tmp_path / "index.html")
    dom = dump_dom(out)
    for anchor in tree["tables"]:
        assert f'id="{anchor}-table"' in dom
    assert dom.count('<table class="results"') == 3
    assert len(re.findall(r"<img\b", dom)) == len(tree["figures"])
    assert f'data-images="{len(tree["figures"])}"' in dom
    assert 'data-broken-images="0"' in dom  # every image loaded (naturalWidth > 0)
    png = browser.screenshot(out)
    assert png == tmp_path / "index.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_older_stats_with_one_paired_entry_per_column() -> None:
    stats = {"paired": [{"column": "C", "row": "X", "best_other": "Y", "seeds": 3, "mean_diff": -1.5,
                         "std_diff": 0.5, "higher_in": 0}], "ordering": [{"column": "C", "rows": 4, "tau": None,
                                                                         "ours_best": "Y", "paper_best": "X"}]}
    text = report.comparisons_html(stats)
    assert "C: X − Y = -1.50 ± 0.50 over 3 seeds (X higher in 0 of 3)" in text and "each other row" not in text
    assert "C: τ = n/a over 4 rows; best here Y, in the paper X" in text


def test_markdown_subset() -> None:
    text = report.markdown_to_html("## Head <1>\n\npara\nline *x* & y\n\n1. a\n   more\n2. b\n\n| a |\n|---|\n| 1 |")
    assert "<h4>Head &lt;1&gt;</h4>" in text and "<p>para line *x* &amp; y</p>" in text
    assert "<ol><li>a more</li><li>b</li></ol>" in text and "<th>a</th>" in text and "<td class=m>1</td>" in text


def test_screenshot_without_chromium_says_how_to_install_it(tree: dict[str, Any], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="apt-get install -y chromium"):
        browser.chromium()
    out = tmp_path / "index.html"
    assert report.main(["--results", str(tree["results"]), "--out", str(out), "--screenshot"]) == 1
    assert out.exists() and not out.with_suffix(".png").exists()
    assert "apt-get install -y chromium" in capsys.readouterr().err


def test_secondary_paper_numbers_are_marked_in_markdown_latex_and_page(tmp_path: Path) -> None:
    frame = frame_of([("FedAvg", "C1", 80.0, 1.0, 2, 70.0, NAN), ("FedX", "C1", 82.0, 1.0, 2, 75.0, NAN),
                      ("FedAvg", "C2", 60.0, 1.0, 2, 50.0, NAN), ("FedX", "C2", 61.0, 1.0, 2, 55.0, NAN)])
    frame.loc[frame["column"] == "C1", "paper_source"] = "secondary-unverified"
    md = write_table(spec_of("gamma", "1", ["FedAvg", "FedX"]), "mini", frame, [], tmp_path / "results")
    text = md.read_text()
    assert "| FedAvg | 80.00 ± 1.00 | 70.00 § | 60.00 ± 1.00 | 50.00 |" in text  # C2's source is the paper's
    assert "§ The paper's number comes from a secondary source (secondary-unverified)" in text
    assert r"70.00 \S{}" in md.with_suffix(".tex").read_text()
    page = report.table_html(report.read_table("gamma", md.with_suffix(".csv"), "mini"))
    assert 'title="source: secondary-unverified">70.00 §</td>' in page
    assert 'title="source: table">50.00</td>' in page
    assert "§" in report.LEGEND


def test_rerender_from_csv_and_stats_equals_the_written_table(tmp_path: Path) -> None:
    from bench.experiment.render import rerender

    paired = [{"column": "C1", "row": "FedX", "other": "FedAvg", "best_other": "FedAvg", "seeds": 2, "mean_diff": 2.0,
               "std_diff": NAN, "ci_low": NAN, "ci_high": NAN, "confidence": 0.95, "higher_in": 2,
               "paper_diff": 5.0, "agrees": True, "contradicts": False, "untestable": None}]  # as collect writes
    ordering = [{"column": "C1", "rows": 2, "tau": NAN, "ours_best": "FedX", "paper_best": "FedX",
                 "untestable": None}]
    frame = frame_of([("FedAvg", "C1", 80.0, 1.0, 2, 70.0, NAN), ("FedX", "C1", 82.0, 1.0, 2, 75.0, NAN)],
                     paired=paired, ordering=ordering)
    spec = spec_of("delta", "1", ["FedAvg", "FedX"])
    md = write_table(spec, "mini", frame, [], tmp_path)
    written = {suffix: md.with_suffix(suffix).read_text() for suffix in (".md", ".tex")}
    for suffix in written:
        md.with_suffix(suffix).write_text("old rendering")
    assert rerender(spec, "mini", tmp_path) == md
    assert {suffix: md.with_suffix(suffix).read_text() for suffix in written} == written
    write_table(spec, "mini", frame, ["failed: FedX | C1 | seed 1"], tmp_path)  # a mark the CSV does not record
    with pytest.raises(ValueError, match="python -m bench.experiment.table"):
        rerender(spec, "mini", tmp_path)
    with pytest.raises(FileNotFoundError, match="write the table first"):
        rerender(spec_of("epsilon", "1", ["FedAvg"]), "mini", tmp_path)


def test_a_table_collected_before_the_ledger_rerenders_without_its_unchecked_marks(tmp_path: Path) -> None:
    from bench.experiment.claims import UNCHECKED
    from bench.experiment.render import rerender

    paired = [{"column": "C1", "row": "FedX", "other": "FedAvg", "best_other": "FedAvg", "seeds": 2, "mean_diff": 2.0,
               "std_diff": NAN, "ci_low": 1.0, "ci_high": 3.0, "confidence": 0.95, "higher_in": 2,
               "paper_diff": 5.0, "agrees": True, "contradicts": False}]  # no "untestable": before the ledger
    frame = frame_of([("FedAvg", "C1", 80.0, 1.0, 2, 70.0, NAN), ("FedX", "C1", 82.0, 1.0, 2, 75.0, NAN)],
                     paired=paired, ordering=[])
    spec = {**spec_of("delta", "1", ["FedAvg", "FedX"]), "columns": [{"name": "C1", "dataset": "fmnist"}]}
    md = write_table(spec, "mini", frame, [], tmp_path)
    assert "| +2.00 [+1.00, +3.00] (paper +5.00) ✓ |" in md.read_text()
    rerender(spec, "mini", tmp_path)
    assert "| +2.00 [+1.00, +3.00] (paper +5.00) (cannot test: unchecked) |" in md.read_text()
    stats = json.loads(md.with_suffix(".stats.json").read_text())
    assert [p["untestable"] for p in stats["paired"]] == [UNCHECKED]
    assert stats["paired"][0]["agrees"] is None


def test_a_figures_caption_file_is_shown_under_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    figures = results / "gamma" / "figures"
    figures.mkdir(parents=True)
    for name in ("fig7_mini", "fig8_mini"):
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.plot([0, 1], [1, 2])
        fig.savefig(figures / f"{name}.png")
        plt.close(fig)
    (figures / "fig7_mini.caption.txt").write_text("Paper (App. A): a < b.\nOurs: 0.6 > 0.5: holds.\n")
    page = report.build(results, tmp_path / "site" / "index.html").read_text()
    captioned = page.split("figures/fig7_mini.png")[-1].split("</figcaption>")[0]
    assert '<span class="claim">Paper (App. A): a &lt; b.</span><span class="claim">Ours: 0.6 &gt; 0.5: holds.</span>' \
        in captioned
    assert "claim" not in page.split("figures/fig8_mini.png")[-1].split("</figcaption>")[0]  # no caption file
