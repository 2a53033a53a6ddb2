"""The benchmark report as one self-contained HTML page (``robo-rl eval --report R.json [--compare S.json]
--html OUT.html``).

Everything is inside the one file: inline CSS, the charts and the evaluation's thumbnails as PNG data URIs,
its videos as MP4 data URIs (up to ``VIDEO_BUDGET`` bytes in all; larger ones are named, not embedded), no
scripts and nothing fetched from elsewhere, so the page can be mailed or attached as it is. Sections (their
element ids, which the tests look for): ``overview`` (mean success per benchmark and policy), then per
benchmark k ``bench-<k>-<benchmark>`` with ``table-<k>`` (per-task success with 95% CIs, drawn as interval
bars, and with two policies the per-task difference), ``comparison-<k>`` (two policies: the difference of the
means and P(improvement)), ``bars-<k>`` (bar chart), ``strength-<k>`` (success vs variation strength, when
swept) and ``media-<k>`` (thumbnails and videos, when the evaluation saved them).
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any

from robo_rl.errors import ConfigError, RoboRLError

VIDEO_BUDGET = 25 * 2**20
"""Most bytes of video embedded in one page; videos past it are listed by path instead."""
MAX_THUMBNAILS = 24
"""Most thumbnails shown per policy and benchmark."""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
"""Policy colours: matplotlib's first four, as in the bar charts."""

CSS = """
:root { --fg: #1d2330; --muted: #5b6476; --line: #dde1ea; --bg: #ffffff; --panel: #f6f7fb; --good: #1b7f3b;
        --bad: #b3261e; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 21px; margin: 40px 0 6px; padding-top: 12px; border-top: 2px solid var(--line); }
h3 { font-size: 16px; margin: 22px 0 8px; }
p { margin: 6px 0; }
.muted { color: var(--muted); }
.legend span { display: inline-block; margin-right: 18px; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px;
          vertical-align: -1px; }
table { border-collapse: collapse; margin: 10px 0; width: 100%; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 6px 10px; text-align: left; vertical-align: middle; }
th { background: var(--panel); font-weight: 600; font-size: 13px; }
td.num { text-align: right; white-space: nowrap; }
tr.mean td { font-weight: 600; background: var(--panel); }
.ci { display: inline-block; position: relative; width: 120px; height: 10px; margin-left: 10px;
      background: #eceff5; border-radius: 5px; vertical-align: middle; }
.ci .range { position: absolute; top: 0; height: 10px; border-radius: 5px; opacity: .35; }
.ci .point { position: absolute; top: -2px; width: 3px; height: 14px; margin-left: -1px; border-radius: 1px; }
.diff.pos { color: var(--good); } .diff.neg { color: var(--bad); }
.callout { background: var(--panel); border-left: 4px solid var(--line); padding: 10px 14px; margin: 12px 0; }
.note { border-left-color: #e0b000; }
figure { margin: 14px 0; }
figure img.chart { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.thumbs { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 12px; }
.thumbs figure { margin: 0; }
.thumbs img { width: 100%; height: auto; image-rendering: pixelated; border-radius: 4px;
              border: 3px solid var(--line); }
.thumbs .success img { border-color: var(--good); } .thumbs .failure img { border-color: var(--bad); }
.videos { display: flex; flex-wrap: wrap; gap: 16px; }
.videos video { max-width: 100%; width: 480px; border-radius: 4px; background: #000; }
dl.env { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; font-size: 13px; }
dl.env dt { color: var(--muted); } dl.env dd { margin: 0; }
nav.toc a { margin-right: 14px; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6e9f0; --muted: #a3abbd; --line: #323848; --bg: #15181f; --panel: #1e2230; --good: #5fd08a;
          --bad: #ff8a80; }
  .ci { background: #2a3040; }
}
"""


def check_html_path(path: str, md: Path) -> Path:
    """``path`` as a Path if it can take the HTML page: it ends in .html or .htm and is not the markdown
    report's own path; a one-line ConfigError otherwise."""
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--html path '{p}' must end in .html (e.g. '{p.with_suffix('.html').name}')")
    if p.resolve() == md.resolve():
        raise ConfigError(f"--html path '{p}' is the markdown report itself; pick another name")
    return p


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text).strip("-") or "benchmark"


def _ci_cell(rate: float, lo: float, hi: float, color: str) -> str:
    """The rate with its CI as text and as a small interval bar."""
    bar = (f'<span class="ci" title="95% CI [{lo:.2f}, {hi:.2f}]"><span class="range" style="left:{100 * lo:.1f}%;'
           f'width:{100 * max(hi - lo, 0.0):.1f}%;background:{color}"></span><span class="point" '
           f'style="left:{100 * rate:.1f}%;background:{color}"></span></span>')
    return f'<td class="num">{rate:.2f} <span class="muted">[{lo:.2f}, {hi:.2f}]</span>{bar}</td>'


def _diff_text(d: float, lo: float, hi: float, digits: int = 2) -> str:
    """A difference with its CI, coloured when the CI excludes 0."""
    kind = "pos" if lo > 0 else "neg" if hi < 0 else ""
    return (f'<span class="diff {kind}">{d:+.{digits}f}</span> '
            f'<span class="muted">[{lo:+.{digits}f}, {hi:+.{digits}f}]</span>')


def _task_differences(runs: list[dict[str, Any]]) -> dict[str, tuple[float, float, float]]:
    """Per task: first minus second success rate with a 95% bootstrap CI over episodes."""
    from robo_rl.eval.stats import success_difference

    a, b = runs
    return {t: tuple(float(v) for v in success_difference([a["tasks"][t]["successes"]], [a["tasks"][t]["episodes"]],
                                                          [b["tasks"][t]["successes"]], [b["tasks"][t]["episodes"]]))
            for t in a["tasks"]}


def _table(k: int, sec: dict[str, Any]) -> list[str]:
    runs, labels = sec["runs"], sec["labels"]
    a = runs[0]
    diffs = _task_differences(runs) if len(runs) == 2 else {}
    head = "".join(f"<th>{_e(lab)} success [95% CI]</th>" for lab in labels)
    if diffs:
        head += f"<th>{_e(labels[0])} - {_e(labels[1])} [95% CI]</th>"
    out = [f'<table id="table-{k}"><thead><tr><th>task</th>{head}</tr></thead><tbody>']
    for t in a["tasks"]:
        cells = "".join(_ci_cell(r["tasks"][t]["success_rate"], *r["tasks"][t]["ci95"], COLORS[i % len(COLORS)])
                        for i, r in enumerate(runs))
        if diffs:
            cells += f'<td class="num">{_diff_text(*diffs[t])}</td>'
        out.append(f"<tr><td>{_e(t)}</td>{cells}</tr>")
    means = "".join(_ci_cell(r["aggregate"]["mean"], r["aggregate"]["mean_low"], r["aggregate"]["mean_high"],
                             COLORS[i % len(COLORS)]) for i, r in enumerate(runs))
    if diffs:
        cmp = sec["comparison"]
        means += f'<td class="num">{_diff_text(*cmp["difference"])}</td>'
    out.append(f'<tr class="mean"><td>mean over tasks</td>{means}</tr>')
    if len(a["tasks"]) >= 4:
        iqm = "".join(f'<td class="num">{r["aggregate"]["iqm_over_tasks"]:.2f}</td>' for r in runs)
        out.append(f"<tr><td>IQM over tasks</td>{iqm}{'<td></td>' if diffs else ''}</tr>")
    out.append("</tbody></table>")
    return out


def _media(res: dict[str, Any]) -> tuple[Path, list[Path], list[Path]]:
    """(media directory, thumbnails, videos) an evaluation saved next to its results file."""
    media = Path(res["_path"]).with_suffix(".media")
    if not media.is_dir():
        return media, [], []
    return media, sorted(media.glob("*.png"))[:MAX_THUMBNAILS], sorted(media.glob("*.mp4"))


def _media_block(k: int, sec: dict[str, Any], page_dir: Path, budget: list[int]) -> list[str]:
    out: list[str] = []
    for res, label in zip(sec["runs"], sec["labels"]):
        media, thumbs, videos = _media(res)
        if not thumbs and not videos:
            continue
        out.append(f"<h3>{_e(label)}: first episodes</h3>")
        if thumbs:
            out.append('<p class="muted">Last frame of each env\'s first episode; the border says the outcome.</p>')
            out.append('<div class="thumbs">')
            for p in thumbs:
                stem = p.stem
                outcome = stem.rsplit("_", 1)[1] if "_" in stem else ""
                name = stem.rsplit("_", 2)[0].replace("_", " ")
                env = stem.rsplit("_", 2)[1] if stem.count("_") >= 2 else ""
                out.append(f'<figure class="{_e(outcome)}"><img alt="{_e(stem)}" src="{_data_uri(p, "image/png")}">'
                           f"<figcaption>{_e(name)} &middot; {_e(env)} &middot; {_e(outcome)}</figcaption></figure>")
            out.append("</div>")
        if videos:
            out.append('<div class="videos">')
            for v in videos:
                size = v.stat().st_size
                if size <= budget[0]:
                    budget[0] -= size
                    out.append(f'<figure><video controls muted loop playsinline preload="auto" '
                               f'src="{_data_uri(v, "video/mp4")}"></video>'
                               f"<figcaption>{_e(v.stem.replace('_', ' '))}</figcaption></figure>")
                else:
                    out.append(f'<p class="muted">Video {_e(os.path.relpath(v, page_dir))} ({size / 2**20:.1f} MiB) '
                               "is not embedded: the page's video budget is used up.</p>")
            out.append("</div>")
    if not out:
        return []
    return [f'<div id="media-{k}">', *out, "</div>"]


def _section(k: int, sec: dict[str, Any], page_dir: Path, budget: list[int]) -> list[str]:
    runs, labels = sec["runs"], sec["labels"]
    a = runs[0]
    env = "".join(f"<dt>{_e(key)}</dt><dd>{_e(v)}</dd>" for key, v in a["environment"].items())
    out = [f'<section id="bench-{k}-{_slug(a["benchmark"])}">', f"<h2>{_e(a['benchmark'])}</h2>",
           f"<p><strong>Varies:</strong> {_e(a['varies'])}.</p>",
           f'<p class="muted">Episodes per task: {_e(a["episodes_per_task"])}, seeds from {_e(a["seed"])}.</p>',
           f'<dl class="env">{env}</dl>', *_table(k, sec)]
    if sec["few"] is not None:
        few, lo, hi = sec["few"]
        out.append(f'<p class="callout note">{few} episodes per task. Bootstrap intervals understate uncertainty at '
                   f"this size (all {few} episodes succeeding gives [1.00, 1.00]; the Wilson interval would be "
                   f"[{lo:.2f}, {hi:.2f}]).</p>")
    cmp = sec["comparison"]
    if cmp is not None:
        out.append(f'<div id="comparison-{k}" class="callout"><p><strong>{_e(labels[0])} vs {_e(labels[1])}.</strong> '
                   f"Success {_e(labels[0])} - {_e(labels[1])} (mean over tasks): {_diff_text(*cmp['difference'], 3)} "
                   "(95% bootstrap over episodes).</p>")
        if cmp["p_improvement"] is not None:
            out.append(f"<p>P({_e(labels[0])} &gt; {_e(labels[1])}) over tasks: {cmp['p_improvement']:.2f}</p>")
        out.append("</div>")
    out.append(f'<figure id="bars-{k}"><img class="chart" alt="success per task" '
               f'src="{_data_uri(sec["bars"], "image/png")}"><figcaption>Success per task with 95% CIs.</figcaption>'
               "</figure>")
    if sec["strength"] is not None:
        out.append(f'<figure id="strength-{k}"><img class="chart" alt="success vs variation strength" '
                   f'src="{_data_uri(sec["strength"], "image/png")}"><figcaption>Success against variation strength '
                   "(multiples of the split's variations, same seeds at every level); bands are 95% CIs."
                   "</figcaption></figure>")
    out += _media_block(k, sec, page_dir, budget)
    return out + ["</section>"]


def _overview(sections: list[dict[str, Any]]) -> list[str]:
    labels = sections[0]["labels"]
    two = len(labels) == 2
    head = "".join(f"<th>{_e(lab)} mean success [95% CI]</th>" for lab in labels)
    if two:
        head += f"<th>{_e(labels[0])} - {_e(labels[1])} [95% CI]</th>"
    rows = []
    for k, sec in enumerate(sections):
        a = sec["runs"][0]
        cells = "".join(_ci_cell(r["aggregate"]["mean"], r["aggregate"]["mean_low"], r["aggregate"]["mean_high"],
                                 COLORS[i % len(COLORS)]) for i, r in enumerate(sec["runs"]))
        if two and sec["comparison"] is not None:
            cells += f'<td class="num">{_diff_text(*sec["comparison"]["difference"])}</td>'
        rows.append(f'<tr><td><a href="#bench-{k}-{_slug(a["benchmark"])}">{_e(a["benchmark"])}</a></td>'
                    f"<td class=\"num\">{len(a['tasks'])}</td>{cells}</tr>")
    legend = "".join(f'<span><span class="swatch" style="background:{COLORS[i % len(COLORS)]}"></span>{_e(lab)}</span>'
                     for i, lab in enumerate(labels))
    return ['<section id="overview">', "<h2>Overview</h2>", f'<p class="legend">{legend}</p>',
            f"<table><thead><tr><th>benchmark</th><th>tasks</th>{head}</tr></thead><tbody>", *rows,
            "</tbody></table>", "</section>"]


def render_html(title: str, sections: list[dict[str, Any]], page_dir: Path) -> str:
    """The page's HTML for the report sections ``write_report`` computed (results, labels, chart paths,
    comparison statistics, small-sample note)."""
    files = sorted({Path(r["_path"]).name for sec in sections for r in sec["runs"]})
    budget = [VIDEO_BUDGET]
    body = [f"<h1>{_e(title)}</h1>",
            f'<p class="muted">robo-rl benchmark results: {_e(", ".join(files))}. Success rates with 95% confidence '
            "intervals; differences are the first policy minus the second.</p>", *_overview(sections)]
    for k, sec in enumerate(sections):
        body += _section(k, sec, page_dir, budget)
    return "\n".join(['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{_e(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>", "<main>", *body,
                      "</main>", "</body>", "</html>", ""])


def write_html(path: Path, title: str, sections: list[dict[str, Any]]) -> Path:
    """Write the self-contained page atomically to ``path`` (creating its directory); a one-line error if
    it cannot be written."""
    from robo_rl.files import atomic_write_text

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, render_html(title, sections, path.parent))
    except OSError as err:
        raise RoboRLError(f"cannot write the HTML report '{path}' ({err.strerror or err}); pass --html in a "
                          "writable place") from None
    return path
